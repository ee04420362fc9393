"""File contents on disk, under ``DATA_DIR/files``, each named by its server-generated id, and
each running batch's prepared lines under ``DATA_DIR/prepared/BATCH_ID`` (`server.prepared`).

A path is only ever built from an id that passed `ids.is_file_id` (or `ids.is_batch_id`), never
from request text. An upload is written to ``ID.part`` and renamed once complete and synced, so a
crash mid-upload leaves no half file under a real id. `sgl-blend run-batch` names its own paths
for its three files (``named``): its input is read where it lies and its results are written
straight into the output and error files the user asked for.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping

from sgl_blend.server.ids import is_batch_id, is_file_id

PARTIAL_SUFFIX = ".part"
STALE_PARTIAL_S = 3600.0
READ_CHUNK = 1 << 20


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
        return self.path(file_id).open("ab")

    def truncate(self, file_id: str, length: int) -> None:
        """Cut a result file back to its committed length (creating it empty if it does not exist):
        bytes past that were written by a run that died before committing them."""
        with self.path(file_id).open("ab") as handle:
            handle.truncate(length)
            handle.flush()
            os.fsync(handle.fileno())

    def read_range(self, file_id: str, offset: int, length: int) -> bytes:
        with self.path(file_id).open("rb") as handle:
            handle.seek(offset)
            return handle.read(length)

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
