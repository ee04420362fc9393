"""Validating a batch's input, streaming: every line parsed once, prepared, and tokenised once.

Each non-blank line becomes one `LineRow`. A bad line (not UTF-8, invalid or too deeply nested
JSON, over the line-size limit, no custom_id, a repeated custom_id, a url the batch does not take,
an invalid body) becomes a row that carries its error, so that it fails alone and the batch goes
on. A good line is prepared a chunk at a time (`Prepare`: converted by SGLang's own handler in
this server's process, which tokenises its prompt; or, in a runner with no engine, tokenised when
the plan reads prompts) and written to the batch's prepared folder (`server.prepared`). Only the
file as a whole can fail the batch: no lines at all, or more than the limit. Nothing of the file is
kept in memory beyond one chunk of lines and the custom_ids seen so far (to find repeats).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sgl_blend.batch_lines.bodies import BodyCaps
from sgl_blend.batch_lines.lines import (
    DEFAULT_MAX_LINE_BYTES,
    BatchLine,
    LineError,
    duplicate_id_error,
    line_too_long,
    parse_line,
)
from sgl_blend.batch_lines.tokenize import LineTokenizer, output_bound
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.server.prepared import PreparedLine, PreparedWriter
from sgl_blend.server.store import BatchStore, LineRow

# How a chunk of good lines is made ready to run: per line, what the engine keeps of it (its
# conversion; empty where the runner has no engine) and its prompt ids for the plan (None: the
# runner reads no prompts).
Prepare = Callable[[Sequence[BatchLine]], list[tuple[bytes, Sequence[int] | None]]]


def as_read(lines: Sequence[BatchLine]) -> list[tuple[bytes, Sequence[int] | None]]:
    """Lines kept as they were read: no conversion, no prompt (a runner with no engine whose plan
    reads no prompts)."""
    return [(b"", None) for _line in lines]


def tokenised(tokenizer: LineTokenizer) -> Prepare:
    """Lines kept as they were read, with their prompts tokenised (a runner with no engine that
    plans or places lines by their prompts)."""
    return lambda lines: [(b"", ids) for ids in tokenizer.prompt_ids_batch(lines)]


# Lines prepared in one call (one batched tokenizer call), and rows handed to the store (and the
# feed) at once: the first chunk small, so the engine gets its first lines at once, then doubling.
FIRST_CHUNK_LINES = 128
CHUNK_LINES = 1024
_READ = 1 << 16


class FileRejected(Exception):
    """The input file as a whole cannot run; ``code`` and ``message`` go to the batch's ``errors``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def as_batch_error(self) -> dict[str, str | int | None]:
        return {"code": self.code, "message": self.message, "param": "input_file_id", "line": None}


@dataclass(frozen=True)
class LineLimits:
    """``urls``: the routes a line may name; ``max_lines``: the most requests in one file;
    ``max_line_bytes``: the longest line (a longer one fails alone, and is never read whole);
    ``caps``: what one line's body may ask for (a line over them fails alone)."""

    urls: tuple[str, ...]
    max_lines: int
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    caps: BodyCaps = BodyCaps()


def index_batch(
    store: BatchStore,
    owner: str,
    batch_id: str,
    input_path: Path,
    folder: Path,
    limits: LineLimits,
    prepare: Prepare = as_read,
    *,
    done: Collection[int] = (),
    on_chunk: Callable[[list[LineRow], dict[int, WorkItem]], None] = lambda _rows, _items: None,
) -> int:
    """Validate a batch's input into its prepared ``folder`` and the store's line index, chunk by
    chunk, handing each stored chunk (its rows, and the prompts read for it by line number) to
    ``on_chunk``, so its lines can run before the rest is read; the number of lines. Lines in
    ``done`` already have a result (a validation that starts again) and are only counted. Raises
    `FileRejected` before anything is stored when the file as a whole cannot run."""
    total = count_requests(input_path, limits)
    writer = PreparedWriter(folder)
    try:
        for rows, items in validate_input(input_path, limits, writer, prepare, done=done):
            stored = [row for row in rows if row.line_number not in done]
            writer.flush()  # the feed reads a stored line's request at once
            store.add_lines(batch_id, owner, stored)
            on_chunk(stored, items)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return total


def count_requests(path: Path, limits: LineLimits) -> int:
    """The file's requests (non-blank lines); `FileRejected` past ``limits.max_lines`` or when there
    are none, found before a line runs."""
    count = 0
    with path.open("rb") as handle:
        for _line in _lines(handle, limits.max_line_bytes):
            count += 1
            if count > limits.max_lines:
                raise FileRejected(
                    "too_many_requests",
                    f"the input file has more than {limits.max_lines} requests, this server's limit",
                )
    if count == 0:
        raise FileRejected("empty_file", "the input file has no requests")
    return count


def validate_input(
    path: Path, limits: LineLimits, writer: PreparedWriter, prepare: Prepare = as_read, *, done: Collection[int] = ()
) -> Iterator[tuple[list[LineRow], dict[int, WorkItem]]]:
    """The file's rows in file order, a chunk at a time, each with the prompts read for it.
    ``writer`` receives every good line (and its prompt, when ``prepare`` reads one) except those
    in ``done``; the caller closes it. Every line is parsed, ``done`` ones too, so a custom_id
    repeated after one of them is still found."""
    seen: set[str] = set()
    chunk: list[BatchLine | LineError] = []
    size = FIRST_CHUNK_LINES
    with path.open("rb") as handle:
        for number, raw in _lines(handle, limits.max_line_bytes):
            parsed = (
                line_too_long(number, limits.max_line_bytes)
                if raw is None
                else parse_line(raw, number, limits.urls, limits.max_line_bytes, limits.caps)
            )
            chunk.append(_unique(parsed, seen))
            if len(chunk) >= size:
                yield _finish_chunk(chunk, writer, prepare, done)
                chunk, size = [], min(2 * size, CHUNK_LINES)
    if chunk:
        yield _finish_chunk(chunk, writer, prepare, done)


def _lines(handle: BinaryIO, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) for every non-blank line; None for a line over ``max_bytes``, which
    is skipped to its end without being kept."""
    number = 0
    while True:
        raw = handle.readline(max_bytes + 2)
        if not raw:
            return
        number += 1
        if len(raw) > max_bytes + 1 or (len(raw) == max_bytes + 1 and not raw.endswith(b"\n")):
            while raw and not raw.endswith(b"\n"):
                raw = handle.readline(_READ)
            yield number, None
        elif raw.strip():
            yield number, raw.rstrip(b"\r\n")


def _unique(parsed: BatchLine | LineError, seen: set[str]) -> BatchLine | LineError:
    """The line, or its error if an earlier line has its custom_id."""
    if isinstance(parsed, BatchLine):
        if parsed.custom_id in seen:
            return duplicate_id_error(parsed.line_number, parsed.custom_id)
        seen.add(parsed.custom_id)
    return parsed


def _finish_chunk(
    chunk: list[BatchLine | LineError], writer: PreparedWriter, prepare: Prepare, done: Collection[int]
) -> tuple[list[LineRow], dict[int, WorkItem]]:
    """The chunk's rows, its good lines (but those ``done``) prepared and written."""
    lines = [line for line in chunk if isinstance(line, BatchLine) and line.line_number not in done]
    prepared = dict(zip((line.line_number for line in lines), zip(lines, prepare(lines)))) if lines else {}
    rows: list[LineRow] = []
    items: dict[int, WorkItem] = {}
    for parsed in chunk:
        number = parsed.line_number
        if isinstance(parsed, LineError):
            rows.append(LineRow(number, parsed.custom_id, 0, 0, error_code=parsed.code, error_message=parsed.message))
        elif number not in prepared:
            rows.append(LineRow(number, parsed.custom_id, 0, 0))
        else:
            line, (conversion, ids) = prepared[number]
            offset, length = writer.add_line(PreparedLine(line.url, line.encoded, conversion))
            rows.append(LineRow(number, line.custom_id, offset, length))
            if ids is not None:
                bound, exact = output_bound(line.body)
                items[number] = writer.add_prompt(number, ids, bound, exact)
    return rows, items
