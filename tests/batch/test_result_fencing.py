"""Two runners appending to one batch's result files (one of them lost its lease without knowing):
no committed length ever covers the other's bytes, and the stale one cuts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.ids import new_file_id
from sgl_blend.server.results import ForeignBytes, LineResult, _ResultFiles
from sgl_blend.server.store import BatchCommit
from sgl_blend.batch_lines.sender import LineOutcome, LineUsage


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
    assert blobs.path(out).read_bytes() == b'{"custom_id": "line-1"}\n'

    stale.committed = current.committed  # both believe they own the end: the stale one writes first
    append(stale, 3)
    with pytest.raises(ForeignBytes):
        append(current, 4)
    current.roll_back()  # the file ends with the other's append: left for the lease holder to cut
    assert blobs.path(out).read_bytes().endswith(b'{"custom_id": "line-3"}\n')


def test_a_failed_commit_rolls_back_only_its_own_append(tmp_path: Path) -> None:
    blobs, out = BlobDir(tmp_path), new_file_id()
    files = _ResultFiles(blobs, out, new_file_id(), 0, 0)
    append(files, 1)
    files.roll_back()
    assert blobs.path(out).read_bytes() == b""
