"""A batch's lines as the executor runs and plans them, written once, when the batch is validated.

Validation parses each line once and converts it once (in this server's process, with SGLang's own
handler, which tokenises it), or, in a runner with no engine of its own, tokenises it once when the
runner plans or places lines by their prompts. What that produces is kept in the batch's own folder
beside the store, so nothing downstream reads, parses or tokenises the input again: not the plan,
not the DP assignment, not the engine, not a batch that joins later, not a restarted runner.

- ``requests.bin``: every runnable line's `PreparedLine`, one record after another; the line's
  row in the store holds the record's offset and length.
- ``prompts.bin`` and ``prompts.idx``: every tokenised line's prompt token ids (int32, 4 bytes a
  token) and one index row per line (line number, first token, token count, output bound,
  exact), read back through a memory map.

Each chunk's records are flushed before its lines are committed and handed to the feed (a line is
sent while the rest of its batch is still read); the folder is made durable when validation ends,
and a validation that starts again rewrites it from the beginning, so a crash never leaves a
half-written folder in use.
"""

from __future__ import annotations

import mmap
import os
import shutil
import struct
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.server.blobs import sync_dir, sync_file

REQUESTS, PROMPTS, PROMPT_INDEX = "requests.bin", "prompts.bin", "prompts.idx"
_INDEX_FIELDS = 5  # line number, first token, token count, output bound, exact
_HEADER = struct.Struct("<HII")  # lengths of the url, the body and the conversion


@dataclass(frozen=True)
class PreparedLine:
    """A line as the runner runs it: its route, its body's JSON bytes (what a remote worker is
    sent) and this server's conversion of it (`server.in_process`; empty in a runner with no
    engine of its own)."""

    url: str
    body: bytes
    conversion: bytes = b""

    def to_bytes(self) -> bytes:
        url = self.url.encode()
        return _HEADER.pack(len(url), len(self.body), len(self.conversion)) + url + self.body + self.conversion

    @classmethod
    def from_bytes(cls, data: bytes) -> PreparedLine:
        url_length, body_length, conversion_length = _HEADER.unpack_from(data)
        start = _HEADER.size
        body_start = start + url_length
        conversion_start = body_start + body_length
        return cls(
            data[start:body_start].decode(),
            data[body_start:conversion_start],
            data[conversion_start : conversion_start + conversion_length],
        )


class PreparedWriter:
    """Appends a batch's prepared requests and prompts; `close` makes them durable."""

    def __init__(self, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.folder = folder
        self._requests: BinaryIO = (folder / REQUESTS).open("wb")
        self._prompts: BinaryIO = (folder / PROMPTS).open("wb")
        self._index = array("q")
        self._tokens = 0

    def add_line(self, line: PreparedLine) -> tuple[int, int]:
        """Store one line; its (offset, length) in the request file."""
        offset = self._requests.tell()
        data = line.to_bytes()
        self._requests.write(data)
        return offset, len(data)

    def add_prompt(self, line_number: int, token_ids: Iterable[int], output_bound: int, exact: bool) -> WorkItem:
        """Store one line's prompt; the line as the planner reads it, its prompt kept compact."""
        ids = array("i", token_ids)
        self._prompts.write(ids.tobytes())
        self._index.extend((line_number, self._tokens, len(ids), output_bound, int(exact)))
        self._tokens += len(ids)
        return WorkItem(line_number, ids, output_bound, exact)

    def flush(self) -> None:
        """Make what was added readable (by `PreparedBatch`, through the OS), not yet durable: a
        chunk's lines are handed to the feed while the rest of the batch is still being read."""
        for handle in (self._requests, self._prompts):
            handle.flush()

    def close(self) -> None:
        with (self.folder / PROMPT_INDEX).open("wb") as index:
            index.write(self._index.tobytes())
            sync_file(index)
        for handle in (self._requests, self._prompts):
            sync_file(handle)
            handle.close()
        sync_dir(self.folder)

    def abort(self) -> None:
        for handle in (self._requests, self._prompts):
            handle.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class PreparedBatch:
    """Reads a validated batch's folder. The request file stays open while the batch runs: a
    line's request is one positioned read, cheap enough for the event loop."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._requests: int | None = None

    def line(self, offset: int, length: int) -> PreparedLine:
        if self._requests is None:
            self._requests = os.open(self.folder / REQUESTS, os.O_RDONLY)
        return PreparedLine.from_bytes(os.pread(self._requests, length, offset))

    def close(self) -> None:
        if self._requests is not None:
            os.close(self._requests)
            self._requests = None

    def prompts(self, line_numbers: Iterable[int] | None = None) -> dict[int, WorkItem]:
        """The tokenised lines (of ``line_numbers`` only, when given): line number -> `WorkItem`
        keyed by the line number, its prompt a compact ``array('i')``."""
        index_path, tokens_path = self.folder / PROMPT_INDEX, self.folder / PROMPTS
        if not index_path.exists() or not index_path.stat().st_size:
            return {}
        index = np.fromfile(index_path, dtype=np.int64).reshape(-1, _INDEX_FIELDS)
        if line_numbers is not None:
            index = index[np.isin(index[:, 0], np.fromiter(line_numbers, dtype=np.int64))]
        items: dict[int, WorkItem] = {}
        with tokens_path.open("rb") as handle:
            view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if tokens_path.stat().st_size else b""
            try:
                for number, start, count, bound, exact in index.tolist():
                    ids = array("i")
                    ids.frombytes(view[start * 4 : (start + count) * 4])
                    items[number] = WorkItem(number, ids, bound, bool(exact))
            finally:
                if isinstance(view, mmap.mmap):
                    view.close()
        return items
