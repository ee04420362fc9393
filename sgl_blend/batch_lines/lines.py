"""Lines of an OpenAI batch file: parsing, validation, and the output and error line shapes.

One bad line must fail only itself, so parsing never raises: whatever the bytes (invalid UTF-8, a
document nested a hundred thousand deep, a number of five thousand digits, a line over the size
limit, a body SGLang's request model refuses or one over the caps of `bodies`) it returns either a
runnable `BatchLine` or a `LineError` with the code the error file will carry. A line is parsed
once, when its batch is validated: its body is kept as SGLang's request model (what the engine
converts it from) and as the JSON bytes a remote worker is sent.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sgl_blend.batch_lines.bodies import BodyCaps, validate_body

SUPPORTED_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# `sgl-blend run-batch` takes a `vllm run-batch` file as it is: chat and completion lines mixed.
# Its batch's endpoint names both routes (`endpoint_urls`).
RUN_BATCH_URLS = ("/v1/chat/completions", "/v1/completions")
ENDPOINT_SEPARATOR = "|"
RUN_BATCH_ENDPOINT = ENDPOINT_SEPARATOR.join(RUN_BATCH_URLS)
REQUIRED_BODY_FIELD = {"/v1/chat/completions": "messages", "/v1/completions": "prompt", "/v1/embeddings": "input"}
# Body fields the executor sets on each request it runs; a line's own value would override them.
EXECUTOR_FIELDS = ("rid", "routed_dp_rank")
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class BatchLine:
    """A runnable line: its body as parsed, as SGLang's request model validated it (``request``),
    and as the JSON bytes without the executor's fields (``encoded``)."""

    line_number: int
    custom_id: str
    url: str
    body: dict[str, Any]
    encoded: bytes
    request: BaseModel


@dataclass(frozen=True)
class LineError:
    line_number: int
    custom_id: str | None
    code: str
    message: str


def parse_line(
    raw: bytes | str,
    line_number: int,
    allowed_urls: tuple[str, ...] = SUPPORTED_URLS,
    max_bytes: int = DEFAULT_MAX_LINE_BYTES,
    caps: BodyCaps = BodyCaps(),
) -> BatchLine | LineError:
    """The line's bytes parsed (see the module's docstring: this never raises)."""
    if len(raw) > max_bytes:
        return line_too_long(line_number, max_bytes)
    try:
        record = json.loads(raw)
    except UnicodeDecodeError as error:
        return LineError(line_number, None, "invalid_json", f"line {line_number} is not UTF-8: {error.reason}")
    except json.JSONDecodeError as error:
        return LineError(line_number, None, "invalid_json", f"line {line_number} is not valid JSON: {error.msg}")
    except RecursionError:
        return LineError(line_number, None, "invalid_json", f"line {line_number} is nested too deeply")
    except ValueError as error:  # an integer past Python's digit limit
        return LineError(line_number, None, "invalid_json", f"line {line_number}: {error}")
    return parse_record(record, line_number, allowed_urls, caps)


def parse_record(
    record: Any, line_number: int, allowed_urls: tuple[str, ...] = SUPPORTED_URLS, caps: BodyCaps = BodyCaps()
) -> BatchLine | LineError:
    """A line already decoded from JSON (a remote runner's line, `server.line_route`), checked as
    `parse_line` checks it."""
    if not isinstance(record, dict):
        return LineError(line_number, None, "invalid_request", f"line {line_number} is not a JSON object")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(line_number, None, "missing_custom_id", f"line {line_number} has no string custom_id")
    url = record.get("url")
    if url not in allowed_urls:
        return LineError(line_number, custom_id, "invalid_url", f"url {url!r} is not one of {', '.join(allowed_urls)}")
    method = record.get("method", "POST")
    if method != "POST":
        return LineError(line_number, custom_id, "invalid_method", f"method must be POST, got {method!r}")
    body = record.get("body")
    if not isinstance(body, dict):
        return LineError(line_number, custom_id, "invalid_body", "body must be a JSON object")
    if REQUIRED_BODY_FIELD[url] not in body:
        return LineError(line_number, custom_id, "invalid_body", f"body for {url} needs {REQUIRED_BODY_FIELD[url]!r}")
    if body.get("stream"):
        return LineError(line_number, custom_id, "invalid_body", "stream is not supported in a batch line")
    try:
        encoded = _encode(body)
    except (RecursionError, ValueError) as error:
        return LineError(line_number, custom_id, "invalid_body", f"the body cannot be encoded: {error}")
    request = validate_body(url, encoded, caps)
    if isinstance(request, str):
        return LineError(line_number, custom_id, "invalid_body", request)
    return BatchLine(line_number, custom_id, url, body, encoded, request)


def read_lines(path: Path, urls: tuple[str, ...] = RUN_BATCH_URLS) -> Iterator[BatchLine | LineError]:
    """Every non-blank line of a small batch file, parsed: for tools that replay a file as load
    (`sgl-blend tune-slo`), not for running a batch, which the runner validates as it streams."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                yield parse_line(raw.rstrip(b"\r\n"), number, urls)


def endpoint_urls(endpoint: str) -> tuple[str, ...]:
    """The routes a batch's lines may name: its one endpoint, or run-batch's several."""
    return tuple(endpoint.split(ENDPOINT_SEPARATOR))


def line_too_long(line_number: int, max_bytes: int) -> LineError:
    return LineError(line_number, None, "line_too_long", f"line {line_number} is longer than {max_bytes} bytes")


def duplicate_id_error(line_number: int, custom_id: str) -> LineError:
    """The error of a line whose custom_id an earlier line already has. Its error record carries no
    custom_id, so that every custom_id in the output and error files still names one line."""
    return LineError(
        line_number, None, "duplicate_custom_id", f"custom_id {custom_id!r} appears more than once (line {line_number})"
    )


def _encode(body: dict[str, Any]) -> bytes:
    """The body without the executor's fields, as JSON bytes. NaN and infinities stay as the line
    wrote them: the engine judges them, and its answer is the line's result."""
    kept = {name: value for name, value in body.items() if name not in EXECUTOR_FIELDS}
    return json.dumps(kept, ensure_ascii=False).encode()


def new_line_id() -> str:
    return f"batch_req_{secrets.token_hex(12)}"


def output_record(custom_id: str, status_code: int, body: Any, request_id: str | None = None) -> dict[str, Any]:
    """A line of the output file (status 200) or of the error file (any other status)."""
    return {
        "id": new_line_id(),
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": request_id or new_line_id(), "body": body},
        "error": None,
    }


def line_error_record(error: LineError) -> dict[str, Any]:
    return error_record(error.custom_id, error.code, error.message, error.line_number)


def error_record(custom_id: str | None, code: str, message: str, line_number: int | None = None) -> dict[str, Any]:
    """A line of the error file for a request that got no response at all."""
    record: dict[str, Any] = {
        "id": new_line_id(),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
    if line_number is not None:
        record["line"] = line_number
    return record
