"""The store's contract, run against both backends: SQLite in a data directory and a real PostgreSQL."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sqlite3
import threading
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import func, select, text, update

from sgl_blend.server.assignment import Slot
from sgl_blend.server.db import SQLITE_FILE, StoreInUse
from sgl_blend.server.ids import new_batch_id, new_file_id
from sgl_blend.server.prepared import PreparedBatch
from sgl_blend.server.store import (AlreadyCommitted, BatchCommit, BatchRow, BatchStore, Conflict, FileRow, LeaseLost,
                                    key_owner)
from sgl_blend.server.store_lines import fence
from sgl_blend.server.store_schema import MIGRATIONS, batches, schema_version
from sgl_blend.server.validation import CHUNK_LINES, FileRejected, LineLimits, index_batch
from tests.batch.postgres import new_database
from tests.batch.helpers import chat_line, jsonl
from tests.waiting import wait_for

_database_numbers = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BatchStore]:
    if request.param == "sqlite":
        opened = BatchStore.open("", tmp_path / "data")
    else:
        url = new_database(request.getfixturevalue("postgres_url"), f"contract_{next(_database_numbers)}")
        opened = BatchStore.open(url, tmp_path / "data")
    yield opened
    opened.close()


def a_file(created_at: int = 100, purpose: str = "batch") -> FileRow:
    return FileRow(new_file_id(), purpose, "in.jsonl", 10, created_at)


def a_batch(input_file_id: str, created_at: int = 100) -> BatchRow:
    return BatchRow(new_batch_id(), "/v1/chat/completions", input_file_id, "24h", "validating", created_at,
                    created_at + 86400, output_blob=new_file_id(), error_blob=new_file_id(), metadata={"k": "v"})


def started(store: BatchStore, tmp_path: Path, lines: list, owner: str = "runner-a") -> BatchRow:
    """A batch taken up by ``owner`` and validated from a real input file."""
    source = a_file()
    store.add_file(source)
    batch = a_batch(source.id)
    store.add_batch(batch)
    store.claim_batches(owner, now=1000.0, lease_s=30)
    path = tmp_path / "input.jsonl"
    path.write_bytes(jsonl(lines))
    total = index_batch(store, owner, batch.id, path, tmp_path / "prepared", LineLimits((batch.endpoint,), 100))
    store.start_batch(batch.id, owner, total, now=1001)
    return store.get_batch(batch.id)


def test_files_page_and_delete(store: BatchStore) -> None:
    files = [a_file(created_at=100 + index) for index in range(5)]
    for row in files:
        store.add_file(row)
    store.add_file(a_file(purpose="batch_output"))
    page, more = store.list_files(after=None, limit=2, order="desc", purpose="batch")
    assert [row.id for row in page] == [files[4].id, files[3].id] and more
    page, more = store.list_files(after=files[3].id, limit=10, order="desc", purpose="batch")
    assert [row.id for row in page] == [files[2].id, files[1].id, files[0].id] and not more
    page, _ = store.list_files(after=files[1].id, limit=2, order="asc")
    assert [row.id for row in page] == [files[2].id, files[3].id]
    with pytest.raises(KeyError):
        store.list_files(after="file-unknown", limit=2)
    assert store.get_file(files[0].id) == files[0]
    assert store.delete_file(files[0].id) == files[0]
    assert store.get_file(files[0].id) is None and store.delete_file(files[0].id) is None


def test_an_input_file_cannot_be_deleted_under_an_unfinished_batch(store: BatchStore) -> None:
    source = a_file()
    store.add_file(source)
    store.add_batch(a_batch(source.id))
    with pytest.raises(Conflict):
        store.delete_file(source.id)
    assert store.get_file(source.id) is not None


def test_batches_page_newest_first(store: BatchStore) -> None:
    source = a_file()
    store.add_file(source)
    batches = [a_batch(source.id) for _ in range(4)]
    for row in batches:
        store.add_batch(row)
    page, more = store.list_batches(after=None, limit=3)
    assert [row.id for row in page] == [row.id for row in batches[::-1][:3]] and more
    page, more = store.list_batches(after=page[-1].id, limit=3)
    assert [row.id for row in page] == [batches[0].id] and not more
    assert store.get_batch(batches[0].id).metadata == {"k": "v"}


def test_leases_fence_a_second_runner(store: BatchStore) -> None:
    source = a_file()
    store.add_file(source)
    batch = a_batch(source.id)
    store.add_batch(batch)
    assert [row.id for row in store.claim_batches("runner-a", now=1000.0, lease_s=30)] == [batch.id]
    assert store.claim_batches("runner-b", now=1010.0, lease_s=30) == []
    assert [row.id for row in store.claim_batches("runner-a", now=1020.0, lease_s=30)] == [batch.id]
    assert store.claim_batches("runner-b", now=1049.0, lease_s=30) == []
    assert [row.id for row in store.claim_batches("runner-b", now=1051.0, lease_s=30)] == [batch.id]
    with pytest.raises(LeaseLost):
        store.commit_results("runner-a", BatchCommit(batch.id, completed_lines=[1], output_bytes=10))
    assert store.get_batch(batch.id).output_bytes == 0
    assert [row.id for row in store.claim_batches("runner-c", now=1052.0, lease_s=30, steal=True)] == [batch.id]
    store.release("runner-c")
    assert [row.id for row in store.claim_batches("runner-a", now=1053.0, lease_s=30)] == [batch.id]


def test_a_batch_created_with_a_lease_stays_with_its_owner(store: BatchStore) -> None:
    source = a_file()
    store.add_file(source)
    batch = dataclasses.replace(a_batch(source.id), owner="runner-a", lease_until=1030.0)
    store.add_batch(batch)
    assert store.claim_batches("runner-b", now=1000.0, lease_s=30) == []
    assert [row.id for row in store.claim_batches("runner-a", now=1000.0, lease_s=30)] == [batch.id]
    assert [row.id for row in store.claim_batches("runner-b", now=1031.0, lease_s=30)] == [batch.id]
    free = a_batch(source.id)  # as the routes create them: no owner, any runner takes it up
    store.add_batch(free)
    assert [row.id for row in store.claim_batches("runner-c", now=1032.0, lease_s=30)] == [free.id]


def test_validation_indexes_lines_and_bad_ones_carry_their_error(store: BatchStore, tmp_path: Path) -> None:
    wrong_url = {**chat_line("c"), "url": "/v1/embeddings"}
    batch = started(store, tmp_path, [chat_line("a"), "", "{oops", chat_line("a"), wrong_url, chat_line("b")])
    assert batch.status == "in_progress" and batch.total == 5 and batch.in_progress_at == 1001
    lines = store.pending_lines(batch.id, after_line=0, limit=10)
    assert [(line.line_number, line.custom_id, line.error_code) for line in lines] == [
        (1, "a", None), (3, None, "invalid_json"), (4, None, "duplicate_custom_id"), (5, "c", "invalid_url"),
        (6, "b", None)]
    assert not store.start_batch(batch.id, "runner-a", 5, now=1002)  # a stale second start changes nothing
    assert store.clear_lines(batch.id, "runner-a") is None  # nor does a stale validation
    assert store.get_batch(batch.id).in_progress_at == 1001
    prepared = PreparedBatch(tmp_path / "prepared").line(lines[4].byte_offset, lines[4].byte_length)
    assert prepared.url == "/v1/chat/completions" and json.loads(prepared.body) == chat_line("b")["body"]
    assert [line.line_number for line in store.pending_lines(batch.id, after_line=3, limit=2)] == [4, 5]


def test_a_rejected_file_leaves_no_lines_behind(store: BatchStore, tmp_path: Path) -> None:
    source = a_file()
    store.add_file(source)
    batch = a_batch(source.id)
    store.add_batch(batch)
    store.claim_batches("runner-a", now=1000.0, lease_s=30)
    path = tmp_path / "input.jsonl"
    path.write_bytes(jsonl([chat_line(str(index)) for index in range(CHUNK_LINES + 5)]))
    with pytest.raises(FileRejected) as rejected:
        index_batch(store, "runner-a", batch.id, path, tmp_path / "prepared", LineLimits((batch.endpoint,), CHUNK_LINES + 4))
    assert rejected.value.code == "too_many_requests"
    assert not (tmp_path / "prepared").exists()
    assert store.clear_lines(batch.id, "runner-a") == set()
    assert store.pending_lines(batch.id, after_line=0, limit=10) == []
    store.fail_batch(batch.id, "runner-a", [rejected.value.as_batch_error()], now=1002)
    failed = store.get_batch(batch.id)
    assert failed.status == "failed" and failed.errors[0]["code"] == "too_many_requests"


def test_commits_count_each_line_once_and_assign_workers(store: BatchStore, tmp_path: Path) -> None:
    batch = started(store, tmp_path, [chat_line(str(index)) for index in range(6)])
    store.assign(batch.id, "runner-a", {Slot("http://w1"): [1, 2, 3], Slot("http://w2", 0): [4, 6],
                                        Slot("http://w2", 1): [5]})
    assert [line.line_number for line in store.pending_lines(batch.id, after_line=0, limit=9, worker="http://w2")] \
        == [4, 5, 6]
    assert [(line.line_number, line.dp_rank) for line in store.pending_lines(batch.id, slot=Slot("http://w2", 0))] \
        == [(4, 0), (6, 0)]
    assert [line.line_number for line in store.pending_lines(batch.id, slot=Slot("http://w1"))] == [1, 2, 3]
    assert store.pending_lines(batch.id, slot=Slot("http://w1", 0)) == []
    store.commit_results("runner-a", BatchCommit(batch.id, completed_lines=[1, 2], failed_lines=[4], input_tokens=30,
                                                 cached_tokens=10, output_tokens=8, output_bytes=200, error_bytes=90))
    with pytest.raises(AlreadyCommitted) as twice:
        store.commit_results("runner-a", BatchCommit(batch.id, completed_lines=[2, 3], output_bytes=300))
    assert twice.value.lines == {2}
    row = store.get_batch(batch.id)
    assert (row.completed, row.failed, row.output_bytes, row.error_bytes) == (2, 1, 200, 90)
    assert (row.input_tokens, row.cached_tokens, row.output_tokens) == (30, 10, 8)
    assert [line.line_number for line in store.pending_lines(batch.id)] == [3, 5, 6]
    assert [(line.line_number, line.state, line.worker) for line in store.lines(batch.id)] == [
        (1, "completed", "http://w1"), (2, "completed", "http://w1"), (3, "pending", "http://w1"),
        (4, "failed", "http://w2"), (5, "pending", "http://w2"), (6, "pending", "http://w2")]


def test_finishing_respects_the_state_a_cancel_left(store: BatchStore, tmp_path: Path) -> None:
    batch = started(store, tmp_path, [chat_line("x")])
    assert store.request_cancel(batch.id, now=1100).status == "cancelling"
    assert store.request_cancel(batch.id, now=1101).cancelling_at == 1100
    store.set_finalizing(batch.id, "runner-a", now=1102)
    assert not store.finish(batch.id, "runner-a", "completed", 1103, None, None)
    output = FileRow(batch.output_blob, "batch_output", "out.jsonl", 120, 1104)
    assert store.finish(batch.id, "runner-a", "cancelled", 1104, output, None)
    row = store.get_batch(batch.id)
    assert (row.status, row.cancelled_at, row.output_file_id, row.error_file_id, row.owner) == \
        ("cancelled", 1104, batch.output_blob, None, None)
    assert store.get_file(batch.output_blob) == output
    with pytest.raises(Conflict):
        store.request_cancel(batch.id, now=1105)
    assert store.claim_batches("runner-a", now=1106.0, lease_s=30) == []


def test_expired_files_are_listed(store: BatchStore) -> None:
    keep, old = a_file(), FileRow(new_file_id(), "batch", "old.jsonl", 1, 100, expires_at=200)
    store.add_file(keep)
    store.add_file(old)
    assert store.expired_files(199) == [] and store.expired_files(200) == [old]


def test_one_sqlite_store_per_data_directory(tmp_path: Path) -> None:
    first = BatchStore.open("", tmp_path)
    with pytest.raises(StoreInUse):
        BatchStore.open("", tmp_path)
    first.close()
    BatchStore.open("", tmp_path).close()
    with pytest.raises(ValueError):
        BatchStore.open("mysql://somewhere", tmp_path)


def test_a_store_from_before_dp_ranks_gets_the_column(tmp_path: Path) -> None:
    """A data directory made by the first Batch API release: its lines table has no dp_rank."""
    with sqlite3.connect(tmp_path / SQLITE_FILE) as old:
        old.execute("CREATE TABLE batch_lines (batch_id TEXT NOT NULL, line_number BIGINT NOT NULL, custom_id TEXT,"
                    " byte_offset BIGINT NOT NULL, byte_length BIGINT NOT NULL, state TEXT NOT NULL, error_code TEXT,"
                    " error_message TEXT, worker TEXT, PRIMARY KEY (batch_id, line_number))")
        old.execute("INSERT INTO batch_lines VALUES ('b', 1, 'x', 0, 10, 'pending', NULL, NULL, 'http://w')")
    store = BatchStore.open("", tmp_path)
    try:
        assert [(line.worker, line.dp_rank) for line in store.pending_lines("b", slot=Slot("http://w"))] \
            == [("http://w", None)]
    finally:
        store.close()


def test_a_store_from_before_versioning_is_migrated_once(tmp_path: Path) -> None:
    """A data directory made just before the version table: every line column, no creators. It is
    brought to the newest version, which is recorded, and a second open runs no step again."""
    with sqlite3.connect(tmp_path / SQLITE_FILE) as old:
        old.execute("CREATE TABLE files (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
                    " purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes BIGINT NOT NULL, created_at BIGINT NOT NULL,"
                    " expires_at BIGINT)")
        old.execute("CREATE TABLE batch_lines (batch_id TEXT NOT NULL, line_number BIGINT NOT NULL, custom_id TEXT,"
                    " byte_offset BIGINT NOT NULL, byte_length BIGINT NOT NULL, state TEXT NOT NULL, error_code TEXT,"
                    " error_message TEXT, worker TEXT, dp_rank BIGINT, plan_rank BIGINT, placement TEXT,"
                    " PRIMARY KEY (batch_id, line_number))")
        old.execute("INSERT INTO files (id, purpose, filename, bytes, created_at) VALUES ('file-old', 'batch', 'a', 1, 5)")
    for _ in range(2):
        store = BatchStore.open("", tmp_path)
        try:
            with store.db.read() as connection:
                assert connection.execute(select(schema_version.c.version)).scalars().all() == [len(MIGRATIONS)]
                indexes = {row[0] for row in connection.exec_driver_sql(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'batch_lines'")}
            assert {"batch_lines_todo", "batch_lines_plan"} <= indexes
            assert store.get_file("file-old").created_by is None
        finally:
            store.close()


def test_plan_ordered_feeds_read_an_index(tmp_path: Path) -> None:
    """A slot's feed in plan order is one index range, not a sort of every pending line."""
    store = BatchStore.open("", tmp_path)
    try:
        query = ("SELECT * FROM batch_lines WHERE batch_id = 'b' AND state = 'pending' AND plan_rank > 3"
                 " AND dp_rank IS NULL AND worker = 'w' ORDER BY plan_rank, line_number LIMIT 10")
        with store.db.read() as connection:
            plan = " ".join(row[-1] for row in connection.exec_driver_sql("EXPLAIN QUERY PLAN " + query))
        assert "batch_lines_plan" in plan and "TEMP B-TREE" not in plan, plan
    finally:
        store.close()


def test_files_and_batches_belong_to_their_creator(store: BatchStore, tmp_path: Path) -> None:
    alice, bob = key_owner("sk-alice"), key_owner("sk-bob")
    assert alice.startswith("key-sha256:") and "sk-alice" not in alice and alice == key_owner("sk-alice")
    mine, theirs = a_file(), a_file()
    store.add_file(mine, owner=alice)
    store.add_file(theirs, owner=bob)
    assert store.get_file(mine.id, owner=alice).created_by == alice
    assert store.get_file(mine.id, owner=bob) is None and store.get_file(mine.id) is not None
    assert [row.id for row in store.list_files(after=None, limit=10, owner=alice)[0]] == [mine.id]
    assert len(store.list_files(after=None, limit=10)[0]) == 2
    with pytest.raises(KeyError):  # another owner's id is no cursor either
        store.list_files(after=theirs.id, limit=10, owner=alice)
    assert store.delete_file(theirs.id, owner=alice) is None and store.get_file(theirs.id) is not None

    batch = a_batch(mine.id)
    store.add_batch(batch, owner=alice)
    assert store.get_batch(batch.id, owner=bob) is None
    assert store.list_batches(after=None, limit=10, owner=bob) == ([], False)
    assert store.request_cancel(batch.id, now=1100, owner=bob) is None
    assert store.get_batch(batch.id).status == "validating"
    assert store.request_cancel(batch.id, now=1100, owner=alice).status == "cancelling"
    store.claim_batches("runner-a", now=1000.0, lease_s=30)
    output = FileRow(batch.output_blob, "batch_output", "out.jsonl", 10, 1104)
    assert store.finish(batch.id, "runner-a", "cancelled", 1104, output, None)
    assert store.get_file(output.id, owner=alice) == dataclasses.replace(output, created_by=alice)
    assert store.get_file(output.id, owner=bob) is None


def test_a_claim_waits_for_a_fenced_write_and_the_fenced_runner_then_loses(request: pytest.FixtureRequest,
                                                                         tmp_path: Path) -> None:
    """PostgreSQL: a coordinator past its lease that already passed the fence keeps the batch's row
    locked until it commits, so a runner taking over waits for that commit and sees it; after the
    take-over, the old coordinator's next write raises `LeaseLost`."""
    store = BatchStore.open(new_database(request.getfixturevalue("postgres_url"), "fence_lock"), tmp_path)
    try:
        batch = started(store, tmp_path, [chat_line("x"), chat_line("y")])
        claimed: list = []
        with store.db.transaction() as connection:
            fence(connection, batch.id, "runner-a")
            taker = threading.Thread(target=lambda: claimed.extend(
                store.claim_batches("runner-b", now=batch.lease_until + 1, lease_s=30)))
            taker.start()
            waiting = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")

            def lock_waits() -> int:
                # PostgreSQL snapshots its activity view per transaction: each poll is a transaction
                # of its own (committing inside `read()` closed it, and a second poll then failed).
                with store.db.read() as observer:
                    return observer.execute(waiting).scalar()

            wait_for(lock_waits, "the claim to wait on the lock")
            connection.execute(update(batches).where(batches.c.id == batch.id).values(output_bytes=42))
        taker.join()
        assert [(row.owner, row.output_bytes) for row in claimed] == [("runner-b", 42)]
        with pytest.raises(LeaseLost):
            store.commit_results("runner-a", BatchCommit(batch.id, completed_lines=[1], output_bytes=99))
        with store.db.read() as connection:
            assert connection.execute(select(func.count()).select_from(batches)
                                      .where(batches.c.output_bytes == 42)).scalar() == 1
    finally:
        store.close()
