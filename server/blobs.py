"""File contents on disk, under ``DATA_DIR/files``, each named by its server-generated id.

A path is only ever built from an id that passed `ids.is_file_id`, never from request text. An
upload is written to ``ID.part`` and renamed once complete and synced, so a crash mid-upload
leaves no half file under a real id.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import BinaryIO, Iterator

from sgl_blend.server.ids import is_file_id

PARTIAL_SUFFIX = ".part"
STALE_PARTIAL_S = 3600.0
READ_CHUNK = 1 << 20


class BlobDir:
    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "files"
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, file_id: str) -> Path:
        if not is_file_id(file_id):
            raise ValueError(f"not a file id: {file_id!r}")
        return self.root / file_id

    def partial_path(self, file_id: str) -> Path:
        return self.path(file_id).with_suffix(PARTIAL_SUFFIX)

    def publish_partial(self, file_id: str) -> None:
        """Make a finished upload visible under its id, durably."""
        partial = self.partial_path(file_id)
        with partial.open("rb") as handle:
            os.fsync(handle.fileno())
        partial.rename(self.path(file_id))
        self._sync_dir()

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

    def _sync_dir(self) -> None:
        descriptor = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
