"""Lines of an OpenAI batch file: parsing, validation, and the output and error line shapes.

One bad line must fail only itself, so parsing never raises: it returns either a runnable
`BatchLine` or a `LineError` with the OpenAI error code the error file will carry.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

SUPPORTED_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
REQUIRED_BODY_FIELD = {"/v1/chat/completions": "messages", "/v1/completions": "prompt", "/v1/embeddings": "input"}


@dataclass(frozen=True)
class BatchLine:
    line_number: int
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineError:
    line_number: int
    custom_id: str | None
    code: str
    message: str


def parse_line(text: str, line_number: int, allowed_urls: tuple[str, ...] = SUPPORTED_URLS) -> BatchLine | LineError:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        return LineError(line_number, None, "invalid_json", f"line {line_number} is not valid JSON: {error.msg}")
    if not isinstance(record, dict):
        return LineError(line_number, None, "invalid_request", f"line {line_number} is not a JSON object")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(line_number, None, "missing_custom_id", f"line {line_number} has no string custom_id")
    url = record.get("url")
    if url not in allowed_urls:
        return LineError(line_number, custom_id, "invalid_url",
                         f"url {url!r} is not one of {', '.join(allowed_urls)}")
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
    return BatchLine(line_number, custom_id, url, body)


def duplicate_id_error(line_number: int, custom_id: str) -> LineError:
    """The error of a line whose custom_id an earlier line already has. Its error record carries no
    custom_id, so that every custom_id in the output and error files still names one line."""
    return LineError(line_number, None, "duplicate_custom_id",
                     f"custom_id {custom_id!r} appears more than once (line {line_number})")


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
