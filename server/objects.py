"""Store rows as the JSON objects of OpenAI's API (the shapes of `openai.types.Batch` and `FileObject`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sgl_blend.server.store import BatchRow, FileRow


def file_object(row: FileRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": row.created_at,
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "expires_at": row.expires_at,
        "status_details": None,
    }


def batch_object(row: BatchRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": row.status,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "errors": {"object": "list", "data": row.errors} if row.errors else None,
        "created_at": row.created_at,
        "in_progress_at": row.in_progress_at,
        "expires_at": row.expires_at,
        "finalizing_at": row.finalizing_at,
        "completed_at": row.completed_at,
        "failed_at": row.failed_at,
        "expired_at": row.expired_at,
        "cancelling_at": row.cancelling_at,
        "cancelled_at": row.cancelled_at,
        "request_counts": {"total": row.total, "completed": row.completed, "failed": row.failed},
        "metadata": row.metadata,
        "usage": {
            "input_tokens": row.input_tokens,
            "input_tokens_details": {"cached_tokens": row.cached_tokens},
            "output_tokens": row.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": row.input_tokens + row.output_tokens,
        },
    }


def list_object(data: Sequence[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A cursor page: the client asks for the next one with ``after=last_id``."""
    return {
        "object": "list",
        "data": list(data),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
