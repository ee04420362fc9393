"""Indexing a batch's input file, streaming: one `LineRow` per non-blank line, never the whole file.

A bad line (invalid JSON, no custom_id, a repeated custom_id, a url other than the batch's
endpoint, an invalid body) becomes a row that carries its error, so that it fails alone and the
batch goes on. Only the file as a whole can fail the batch: no lines at all, or more than the limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from sgl_blend.jobs.lines import LineError, duplicate_id_error, parse_line
from sgl_blend.server.store import LineRow


class FileRejected(Exception):
    """The input file as a whole cannot run; ``code`` and ``message`` go to the batch's ``errors``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def as_batch_error(self) -> dict[str, str | int | None]:
        return {"code": self.code, "message": self.message, "param": "input_file_id", "line": None}


def index_input_file(path: Path, endpoint: str, max_lines: int) -> Iterator[LineRow]:
    """Rows in file order; raises `FileRejected` past ``max_lines`` or at the end of an empty file.

    Only the custom_ids seen so far are kept (to find repeats), bounded by ``max_lines``."""
    seen: set[str] = set()
    count = 0
    offset = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            count += 1
            if count > max_lines:
                raise FileRejected("too_many_requests",
                                   f"the input file has more than {max_lines} requests, this server's limit")
            yield _row(number, start, len(raw), _parse(raw, number, endpoint, seen))
    if count == 0:
        raise FileRejected("empty_file", "the input file has no requests")


def _parse(raw: bytes, number: int, endpoint: str, seen: set[str]) -> LineError | str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return LineError(number, None, "invalid_json", f"line {number} is not UTF-8: {error.reason}")
    parsed = parse_line(text, number, (endpoint,))
    custom_id = parsed.custom_id
    if custom_id is not None and custom_id in seen:
        return duplicate_id_error(number, custom_id)
    if custom_id is not None:
        seen.add(custom_id)
    return parsed if isinstance(parsed, LineError) else custom_id


def _row(number: int, offset: int, length: int, parsed: LineError | str) -> LineRow:
    if isinstance(parsed, LineError):
        return LineRow(number, parsed.custom_id, offset, length, error_code=parsed.code, error_message=parsed.message)
    return LineRow(number, parsed, offset, length)
