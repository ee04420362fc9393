"""Two runners appending to one batch's result files (one of them lost its lease without knowing):
no committed length ever covers the other's bytes, and the stale one cuts nothing. A commit that
raises is judged by the store before any roll-back, and a result file is never padded."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from sgl_blend.batch_lines.outcome import LineOutcome, LineUsage
from sgl_blend.server.blobs import BlobDir, ResultFileDamaged
from sgl_blend.server.db import open_database
from sgl_blend.server.ids import new_file_id
from sgl_blend.server.results import ForeignBytes, LineResult, ResultWriter, _ResultFiles
from sgl_blend.server.store import BatchCommit, BatchStore, LineRow
from tests.batch.helpers import add_batch, chat_lines


def result(line: int) -> LineResult:
    return LineResult("batch", line, LineOutcome(True, {"custom_id": f"line-{line}"}, LineUsage()))


def append(files: _ResultFiles, line: int) -> BatchCommit:
    commit = BatchCommit("batch")
    files.append([result(line)], commit)
    return commit


def test_a_writer_appends_only_where_its_commits_end(tmp_path: Path) -> None:
    blobs, out, err = BlobDir(tmp_path), new_file_id(), new_file_id()
    current, stale = (_ResultFiles(blobs, out, err, 0, 0) for _ in range(2))
    committed = append(current, 1)
    current.committed = (committed.output_bytes, committed.error_bytes)
    with pytest.raises(ForeignBytes):
        append(stale, 2)  # its committed length (0) is not where the file ends
    stale.roll_back()
    assert blobs.path(out).read_bytes() == b'{"custom_id":"line-1"}\n'

    stale.committed = current.committed  # both believe they own the end: the stale one writes first
    append(stale, 3)
    with pytest.raises(ForeignBytes):
        append(current, 4)
    current.roll_back()  # the file ends with the other's append: left for the lease holder to cut
    assert blobs.path(out).read_bytes().endswith(b'{"custom_id":"line-3"}\n')


def test_a_failed_commit_rolls_back_only_its_own_append(tmp_path: Path) -> None:
    blobs, out = BlobDir(tmp_path), new_file_id()
    files = _ResultFiles(blobs, out, new_file_id(), 0, 0)
    append(files, 1)
    files.roll_back()
    assert blobs.path(out).read_bytes() == b""


class RepliesLost(BatchStore):
    """A store whose commits land but whose caller never hears so (the reply to COMMIT lost on a
    dropped connection), or whose commits fail before landing."""

    land: bool = True

    def commit_results(self, owner: str, commit: BatchCommit) -> None:
        if self.land:
            super().commit_results(owner, commit)
        raise OperationalError("COMMIT", {}, ConnectionError("server closed the connection unexpectedly"))


@pytest.mark.parametrize("landed", [True, False])
def test_a_commit_that_raised_is_checked_against_the_store(tmp_path: Path, landed: bool) -> None:
    """Landed: the bytes stay and the lines are done, not run again. Not landed: the bytes are cut
    and the lines are handed back to be written again. Either way the file ends at the store's length."""
    store, blobs = RepliesLost(open_database("", tmp_path)), BlobDir(tmp_path)
    store.land = landed
    batch_id = add_batch(store, blobs, chat_lines(2), owner="writer")
    store.clear_lines(batch_id, "writer")
    store.add_lines(batch_id, "writer", [LineRow(1, "line-1", 0, 1), LineRow(2, "line-2", 0, 1)])
    store.start_batch(batch_id, "writer", 2, now=1)
    row = store.get_batch(batch_id)
    writer = ResultWriter(store, blobs, "writer")
    writer.open(batch_id, row.output_blob, row.error_blob, 0, 0)

    retry = writer._commit_group([LineResult(batch_id, 1, result(1).outcome)])

    after = store.get_batch(batch_id)
    assert (after.completed, len(retry)) == ((1, 0) if landed else (0, 1))
    assert blobs.path(row.output_blob).stat().st_size == after.output_bytes
    assert batch_id not in writer.lost_batches
    store.close()


def test_a_result_file_shorter_than_committed_is_never_padded(tmp_path: Path) -> None:
    blobs, out = BlobDir(tmp_path), new_file_id()
    blobs.path(out).write_bytes(b'{"custom_id": "a"}\n')
    blobs.truncate(out, 10)
    assert blobs.path(out).read_bytes() == b'{"custom_i'
    with pytest.raises(ResultFileDamaged):
        blobs.truncate(out, 50)
    assert blobs.path(out).read_bytes() == b'{"custom_i'
    with pytest.raises(ResultFileDamaged):
        blobs.truncate(new_file_id(), 5)
    blobs.truncate(fresh := new_file_id(), 0)
    assert blobs.path(fresh).read_bytes() == b""
