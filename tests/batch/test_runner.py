"""The runner spreading one batch over two workers. Both are the shared server under two names
(127.0.0.1 and localhost), so this costs no second server; each line records its worker."""

from __future__ import annotations

import pytest

import json
import time
from collections import Counter
from pathlib import Path

from sgl_blend.server.assignment import Slot, split_evenly
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.ids import new_file_id
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import BatchStore, FileRow
from sgl_blend.launch.supervisor import ServerProcess
from tests.batch.conftest import API_KEY
from tests.batch.helpers import add_batch, chat_lines, run_until


def test_split_evenly_keeps_neighbours_together() -> None:
    a, b, c = Slot("a"), Slot("b", 0), Slot("b", 1)
    assert split_evenly([7, 1, 2, 4, 5], [a, b]) == {a: [1, 2], b: [4, 5, 7]}
    assert split_evenly([3], [a, b, c]) == {c: [3]}
    assert split_evenly([], [a]) == {}


def test_housekeeping_deletes_expired_files(tmp_path: Path) -> None:
    """No batch and no server needed: the runner's first step already sweeps expired files."""
    store, blobs = BatchStore.open("", tmp_path), BlobDir(tmp_path)
    expired, kept = new_file_id(), new_file_id()
    for file_id, expires_at in ((expired, int(time.time()) - 1), (kept, int(time.time()) + 3600)):
        blobs.path(file_id).write_bytes(b"{}\n")
        store.add_file(FileRow(file_id, "batch", "in.jsonl", 3, int(time.time()) - 10, expires_at))
    runner = BatchRunner(store, blobs, workers=["http://127.0.0.1:9"], owner="test-runner")

    run_until(runner, lambda: store.get_file(expired) is None, "the expired file's row to go")
    assert not blobs.path(expired).exists()
    assert store.get_file(kept) is not None and blobs.path(kept).exists()
    store.close()


@pytest.mark.server
def test_one_batch_over_two_workers(batch_server: ServerProcess, tmp_path: Path) -> None:
    store, blobs = BatchStore.open("", tmp_path), BlobDir(tmp_path)
    lines = chat_lines(40, "spread")
    batch_id = add_batch(store, blobs, lines)
    port = batch_server.base_url.rsplit(":", 1)[1]
    workers = [batch_server.base_url, f"http://localhost:{port}"]
    runner = BatchRunner(store, blobs, workers=workers, owner="test-runner", api_key=API_KEY, max_inflight=8)

    run_until(runner, lambda: store.get_batch(batch_id).status == "completed", "the batch to complete")
    finished = store.get_batch(batch_id)
    assert finished.status == "completed" and finished.completed == 40
    done = [json.loads(line)["custom_id"] for line in blobs.path(finished.output_file_id).read_text().splitlines()]
    assert sorted(done) == sorted(line["custom_id"] for line in lines)
    shares = Counter(line.worker for line in store.lines(batch_id))
    assert shares == {workers[0]: 20, workers[1]: 20}
    store.close()
