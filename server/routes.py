"""The HTTP surface: OpenAI's Files and Batches routes, served in front of SGLang's own app.

Handlers only check the request and touch the store; the runner does the work and is woken when a
batch is created or cancelled. Store calls run in worker threads, so a commit's fsync never
stalls the event loop that also serves SGLang's online routes. Every handler first names its
caller (`server.auth`): what a caller creates is recorded as theirs, and what they read, list,
delete or cancel goes through their owner filter, so another key's object is a 404. Every body is
bounded: uploads part by part (`server.uploads`), a batch request at `MAX_JSON_BODY_BYTES`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from sgl_blend.batch_lines.lines import SUPPORTED_URLS
from sgl_blend.server.auth import BatchKeys, Caller
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.server.errors import ApiError, not_found
from sgl_blend.server.ids import is_batch_id, is_file_id, new_batch_id, new_file_id
from sgl_blend.server.objects import batch_object, file_object, list_object
from sgl_blend.server.store import BatchRow, BatchStore, Conflict, FileRow
from sgl_blend.server.uploads import BadUpload, UploadTooLarge, receive_upload

INPUT_PURPOSE = "batch"
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
MIN_EXPIRES_AFTER_S, MAX_EXPIRES_AFTER_S = 3600, 30 * 24 * 3600
# A batch request is a few ids, a window and at most 16 metadata pairs: a few kilobytes.
MAX_JSON_BODY_BYTES = 64 * 1024
_WINDOW = re.compile(r"(\d+)([smh])")
_WINDOW_UNIT_S = {"s": 1, "m": 60, "h": 3600}


@dataclass
class ApiContext:
    config: BatchApiConfig
    store: BatchStore
    blobs: BlobDir
    wake_runner: Callable[[], None]


def build_router(context: ApiContext, keys: BatchKeys) -> APIRouter:
    def caller(request: Request) -> Caller:
        return keys.caller(request.headers.get("authorization"))

    # On the router too, so that no route of it can be reached without a key by forgetting ``who``.
    router = APIRouter(dependencies=[Depends(caller)])
    store, blobs, config = context.store, context.blobs, context.config

    @router.post("/v1/files")
    async def create_file(request: Request, who: Caller = Depends(caller)) -> dict:
        file_id = new_file_id()
        partial = blobs.partial_path(file_id)
        try:
            upload = await receive_upload(request, partial, config.max_file_bytes)
            purpose = upload.fields.get("purpose")
            if purpose != INPUT_PURPOSE:
                raise ApiError(
                    400, f"purpose must be {INPUT_PURPOSE!r} on this server, got {purpose!r}", param="purpose"
                )
            now = int(time.time())
            expires_after = _expires_after(
                {
                    key[len("expires_after[") : -1]: value
                    for key, value in upload.fields.items()
                    if key.startswith("expires_after[")
                }
                or None,
                "expires_after",
            )
            row = FileRow(
                file_id,
                purpose,
                _safe_filename(upload.filename),
                upload.bytes,
                now,
                now + expires_after if expires_after else None,
            )
            await asyncio.to_thread(blobs.publish_partial, file_id)
            await asyncio.to_thread(functools.partial(store.add_file, row, owner=who.owner))
        except UploadTooLarge as error:
            raise ApiError(
                413,
                str(error),
                code="file_too_large" if error.param == "file" else "form_field_too_large",
                param=error.param,
            ) from None
        except BadUpload as error:
            raise ApiError(400, str(error), param="file") from None
        finally:
            partial.unlink(missing_ok=True)
        return file_object(row)

    @router.get("/v1/files")
    async def list_files(request: Request, who: Caller = Depends(caller)) -> dict:
        query = request.query_params
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "order must be 'asc' or 'desc'", param="order")
        limit = _limit(query.get("limit"), default=10_000, maximum=10_000)
        rows, more = await _page(
            store.list_files,
            after=query.get("after"),
            limit=limit,
            order=order,
            purpose=query.get("purpose"),
            owner=who.scope,
        )
        return list_object([file_object(row) for row in rows], more)

    @router.get("/v1/files/{file_id}")
    async def retrieve_file(file_id: str, who: Caller = Depends(caller)) -> dict:
        return file_object(await _file(store, file_id, who))

    @router.get("/v1/files/{file_id}/content")
    async def file_content(file_id: str, who: Caller = Depends(caller)) -> StreamingResponse:
        row = await _file(store, file_id, who)
        return StreamingResponse(
            blobs.iter_content(row.id, row.bytes),
            media_type="application/octet-stream",
            headers={"Content-Length": str(row.bytes)},
        )

    @router.delete("/v1/files/{file_id}")
    async def delete_file(file_id: str, who: Caller = Depends(caller)) -> dict:
        if not is_file_id(file_id):
            raise not_found("file", file_id)
        try:
            row = await asyncio.to_thread(functools.partial(store.delete_file, file_id, owner=who.scope))
        except Conflict as error:
            raise ApiError(409, str(error), code="file_in_use") from None
        if row is None:
            raise not_found("file", file_id)
        await asyncio.to_thread(blobs.delete, file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    @router.post("/v1/batches")
    async def create_batch(request: Request, who: Caller = Depends(caller)) -> dict:
        body = await _json_object(request)
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str):
            raise ApiError(400, "input_file_id is required", param="input_file_id")
        endpoint = body.get("endpoint")
        if endpoint not in SUPPORTED_URLS:
            raise ApiError(
                400, f"endpoint must be one of {', '.join(SUPPORTED_URLS)}, got {endpoint!r}", param="endpoint"
            )
        window = body.get("completion_window")
        window_s = _window_seconds(window)
        assert isinstance(window, str), "_window_seconds takes nothing else"
        metadata = _metadata(body.get("metadata"))
        output_expires_after = _expires_after(body.get("output_expires_after"), "output_expires_after")
        input_file = await _owned_file(store, input_file_id, who)
        if input_file is None:
            raise ApiError(400, f"No file with id {input_file_id!r}", param="input_file_id", code="invalid_input_file")
        if input_file.purpose != INPUT_PURPOSE:
            raise ApiError(
                400,
                f"file {input_file_id} has purpose {input_file.purpose!r}, not {INPUT_PURPOSE!r}",
                param="input_file_id",
                code="invalid_input_file",
            )
        now = int(time.time())
        row = BatchRow(
            new_batch_id(),
            endpoint,
            input_file_id,
            window,
            "validating",
            now,
            now + window_s,
            output_blob=new_file_id(),
            error_blob=new_file_id(),
            metadata=metadata,
            output_expires_after=output_expires_after,
        )
        await asyncio.to_thread(functools.partial(store.add_batch, row, owner=who.owner))
        context.wake_runner()
        return batch_object(row)

    @router.get("/v1/batches")
    async def list_batches(request: Request, who: Caller = Depends(caller)) -> dict:
        query = request.query_params
        limit = _limit(query.get("limit"), default=20, maximum=100)
        rows, more = await _page(store.list_batches, after=query.get("after"), limit=limit, owner=who.scope)
        return list_object([batch_object(row) for row in rows], more)

    @router.get("/v1/batches/{batch_id}")
    async def retrieve_batch(batch_id: str, who: Caller = Depends(caller)) -> dict:
        row = (
            await asyncio.to_thread(functools.partial(store.get_batch, batch_id, owner=who.scope))
            if is_batch_id(batch_id)
            else None
        )
        if row is None:
            raise not_found("batch", batch_id)
        return batch_object(row)

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str, who: Caller = Depends(caller)) -> dict:
        try:
            row = (
                await asyncio.to_thread(
                    functools.partial(store.request_cancel, batch_id, int(time.time()), owner=who.scope)
                )
                if is_batch_id(batch_id)
                else None
            )
        except Conflict as error:
            raise ApiError(409, str(error), code="batch_not_cancellable") from None
        if row is None:
            raise not_found("batch", batch_id)
        context.wake_runner()
        return batch_object(row)

    return router


async def _owned_file(store: BatchStore, file_id: str, who: Caller) -> FileRow | None:
    """The file, if it exists and the caller may see it."""
    if not is_file_id(file_id):
        return None
    return await asyncio.to_thread(functools.partial(store.get_file, file_id, owner=who.scope))


async def _file(store: BatchStore, file_id: str, who: Caller) -> FileRow:
    row = await _owned_file(store, file_id, who)
    if row is None:
        raise not_found("file", file_id)
    return row


async def _page(list_rows: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(list_rows, **kwargs)
    except KeyError:
        raise ApiError(400, f"after: no object with id {kwargs['after']!r}", param="after") from None


async def _json_object(request: Request) -> dict[str, Any]:
    """The request's JSON object body, read only up to `MAX_JSON_BODY_BYTES` (413 past it)."""
    too_large = ApiError(413, f"the request body is larger than {MAX_JSON_BODY_BYTES} bytes", code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_JSON_BODY_BYTES:
        raise too_large
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_JSON_BODY_BYTES:
            raise too_large
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _limit(text: str | None, *, default: int, maximum: int) -> int:
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= maximum:
        raise ApiError(400, f"limit must be an integer from 1 to {maximum}", param="limit")
    return int(text)


def _window_seconds(window: Any) -> int:
    """OpenAI's ``24h``, or any other whole number of seconds, minutes or hours (``90s``, ``30m``)."""
    match = _WINDOW.fullmatch(window) if isinstance(window, str) else None
    if not match or int(match.group(1)) == 0:
        raise ApiError(
            400, f"completion_window must be like '24h', '30m' or '90s', got {window!r}", param="completion_window"
        )
    return int(match.group(1)) * _WINDOW_UNIT_S[match.group(2)]


def _metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA_PAIRS
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METADATA_KEY and len(v) <= MAX_METADATA_VALUE
            for k, v in metadata.items()
        )
    ):
        raise ApiError(
            400,
            f"metadata must map at most {MAX_METADATA_PAIRS} string keys (up to {MAX_METADATA_KEY}"
            f" characters) to string values (up to {MAX_METADATA_VALUE})",
            param="metadata",
        )
    return metadata


def _expires_after(policy: Any, param: str) -> int | None:
    """Seconds after creation at which a file expires (``{"anchor": "created_at", "seconds": N}``)."""
    if policy is None:
        return None
    seconds = policy.get("seconds") if isinstance(policy, dict) else None
    if isinstance(seconds, str) and seconds.isdigit():
        seconds = int(seconds)
    if (
        (policy.get("anchor") if isinstance(policy, dict) else None) != "created_at"
        or not isinstance(seconds, int)
        or not MIN_EXPIRES_AFTER_S <= seconds <= MAX_EXPIRES_AFTER_S
    ):
        raise ApiError(
            400,
            f"{param} must be {{'anchor': 'created_at', 'seconds': {MIN_EXPIRES_AFTER_S}..{MAX_EXPIRES_AFTER_S}}}",
            param=param,
        )
    return seconds


def _safe_filename(name: str | None) -> str:
    """The name shown back to the client; it names nothing on disk."""
    return (PurePath(name or "").name or "upload.jsonl")[:255]
