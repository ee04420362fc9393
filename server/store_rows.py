"""The store's rows and errors: what `BatchStore` takes and returns, and how a database row becomes one."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sgl_blend.core.placement import Placement

if TYPE_CHECKING:
    from sqlalchemy import RowMapping

ACTIVE_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL_STATUSES = ("completed", "failed", "expired", "cancelled")
PENDING, COMPLETED, FAILED = "pending", "completed", "failed"
# Rows go in chunks, so that no statement has more parameters than a driver takes.
INSERT_CHUNK = 1000


def key_owner(api_key: str) -> str:
    """The owner a file or batch records for the API key that created it: a stable hash of the
    key, so the store never holds a key and the same key finds its objects after a restart."""
    return "key-sha256:" + hashlib.sha256(api_key.encode()).hexdigest()


class Conflict(Exception):
    """The object is not in a state that allows the request (cancelling a finished batch, ...)."""


class LeaseLost(Exception):
    """This runner no longer coordinates the batch: another one took it over."""


class AlreadyCommitted(Exception):
    """Some lines of a commit were already done: committing them again would count them twice."""

    def __init__(self, batch_id: str, lines: set[int]) -> None:
        super().__init__(f"batch {batch_id}: lines {sorted(lines)} were already committed")
        self.lines = lines


@dataclass(frozen=True)
class FileRow:
    id: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    expires_at: int | None = None
    created_by: str | None = None


@dataclass(frozen=True)
class BatchRow:
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    output_blob: str
    error_blob: str
    metadata: dict[str, str] | None = None
    output_expires_after: int | None = None
    errors: list[dict[str, Any]] | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    output_bytes: int = 0
    error_bytes: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    owner: str | None = None
    lease_until: float = 0.0
    created_by: str | None = None


@dataclass(frozen=True)
class LineRow:
    """One non-blank line of a batch's input. ``byte_offset`` and ``byte_length`` locate its
    prepared request in the batch's request file (`server.prepared`). ``error_code`` set: the line
    is invalid and fails without running (its error record is written like any other result)."""

    line_number: int
    custom_id: str | None
    byte_offset: int
    byte_length: int
    state: str = PENDING
    error_code: str | None = None
    error_message: str | None = None
    worker: str | None = None
    dp_rank: int | None = None
    plan_rank: int | None = None
    placement: Placement | None = None


@dataclass
class BatchCommit:
    """What one group of finished lines changes in one batch, committed atomically."""

    batch_id: str
    completed_lines: list[int] = field(default_factory=list)
    failed_lines: list[int] = field(default_factory=list)
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    output_bytes: int = 0
    error_bytes: int = 0


_BATCH_JSON_COLUMNS = ("metadata", "errors")
_BATCH_FIELDS = tuple(BatchRow.__dataclass_fields__)
_LINE_FIELDS = tuple(LineRow.__dataclass_fields__)


def batch_row(row: RowMapping | Mapping[str, Any]) -> BatchRow:
    values = {name: row[name] for name in _BATCH_FIELDS}
    for name in _BATCH_JSON_COLUMNS:
        values[name] = json.loads(values[name]) if values[name] is not None else None
    return BatchRow(**values)


def file_row(row: RowMapping | Mapping[str, Any]) -> FileRow:
    return FileRow(**{name: row[name] for name in FileRow.__dataclass_fields__})


def line_row(row: RowMapping | Mapping[str, Any]) -> LineRow:
    values = {name: row[name] for name in _LINE_FIELDS}
    values["placement"] = Placement.decode(values["placement"]) if values["placement"] else None
    return LineRow(**values)
