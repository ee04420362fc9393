"""File contents on disk, under ``DATA_DIR/files``, each named by its server-generated id, and
each running batch's prepared lines under ``DATA_DIR/prepared/BATCH_ID`` (`server.prepared`).

A path is only ever built from an id that passed `ids.is_file_id` (or `ids.is_batch_id`), never
from request text. An upload is written to ``ID.part`` and renamed once complete and synced, so a
crash mid-upload leaves no half file under a real id. `sgl-blend run-batch` names its own paths
for its three files (``named``): its input is read where it lies and its results are written
straight into the output and error files the user asked for.

A result file is only ever appended to or cut back to its committed length, never extended by
anything but records: a file shorter than what the store says was committed lost committed
results (a disk or an operator's doing), and `ResultFileDamaged` says so instead of hiding it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from sgl_blend.server.ids import is_batch_id, is_file_id

PARTIAL_SUFFIX = ".part"
STALE_PARTIAL_S = 3600.0
READ_CHUNK = 1 << 20


class ResultFileDamaged(RuntimeError):
    """A result file is shorter than its committed length: committed results are gone."""

    def __init__(self, path: Path, size: int, committed: int) -> None:
        super().__init__(f"{path} has {size} bytes but {committed} were committed: committed results were lost")

    def as_batch_error(self) -> dict[str, str | None]:
        return {"code": "result_file_damaged", "message": str(self), "param": None, "line": None}


class BlobDir:
    def __init__(self, data_dir: Path, named: Mapping[str, Path] | None = None) -> None:
        self.root = Path(data_dir) / "files"
        self.root.mkdir(parents=True, exist_ok=True)
        self.prepared_root = Path(data_dir) / "prepared"
        self._named = dict(named or {})

    def path(self, file_id: str) -> Path:
        if not is_file_id(file_id):
            raise ValueError(f"not a file id: {file_id!r}")
        return self._named.get(file_id) or self.root / file_id

    def prepared_dir(self, batch_id: str) -> Path:
        if not is_batch_id(batch_id):
            raise ValueError(f"not a batch id: {batch_id!r}")
        return self.prepared_root / batch_id

    def delete_prepared(self, batch_id: str) -> None:
        """A finished batch's prepared lines are not needed again."""
        shutil.rmtree(self.prepared_dir(batch_id), ignore_errors=True)

    def partial_path(self, file_id: str) -> Path:
        return self.path(file_id).with_suffix(PARTIAL_SUFFIX)

    def publish_partial(self, file_id: str) -> None:
        """Make a finished upload visible under its id, durably."""
        partial = self.partial_path(file_id)
        with partial.open("rb") as handle:
            os.fsync(handle.fileno())
        partial.rename(self.path(file_id))
        sync_dir(self.root)

    def open_append(self, file_id: str) -> BinaryIO:
        """Unbuffered, so that each write says how many bytes reached the file."""
        return self.path(file_id).open("ab", buffering=0)

    def truncate(self, file_id: str, length: int) -> None:
        """Cut a result file back to its committed length (creating it when nothing was committed):
        bytes past that were written by a run that died before committing them. Raises
        `ResultFileDamaged`, changing nothing, when the file is shorter than that."""
        path = self.path(file_id)
        try:
            descriptor = os.open(path, os.O_WRONLY | (os.O_CREAT if length == 0 else 0), 0o644)
        except FileNotFoundError:
            raise ResultFileDamaged(path, 0, length) from None
        try:
            size = os.fstat(descriptor).st_size
            if size < length:
                raise ResultFileDamaged(path, size, length)
            if size > length:
                os.ftruncate(descriptor, length)
                os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def iter_content(self, file_id: str, length: int) -> Iterator[bytes]:
        """The first ``length`` bytes in chunks: a file is never read whole into memory."""
        with self.path(file_id).open("rb") as handle:
            left = length
            while left > 0:
                chunk = handle.read(min(READ_CHUNK, left))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk

    def delete(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)
        self.partial_path(file_id).unlink(missing_ok=True)

    def sweep_stale_partials(self, now: float | None = None) -> int:
        """Remove uploads abandoned by a crash (an hour old, so no live upload is touched)."""
        cutoff = (time.time() if now is None else now) - STALE_PARTIAL_S
        removed = 0
        for partial in self.root.glob(f"*{PARTIAL_SUFFIX}"):
            if partial.stat().st_mtime < cutoff:
                partial.unlink(missing_ok=True)
                removed += 1
        return removed


def sync_file(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def sync_dir(folder: Path) -> None:
    """Make a rename or a new entry in ``folder`` durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
