"""The line route: another server's batch runner hands this server lines to run in-process.

A runner whose batch is spread over several sgl-blend servers (``--batch-workers``) sends each
remote server chunks of lines, not a request per line: ``POST /sgl_blend/lines`` takes a chunk as
JSON lines -- each a batch line's ``custom_id``, ``url`` and ``body`` with the runner's request id
(``rid``), its offline routing key (with the line's placement) and its DP rank -- and answers with
one JSON line per finished line, in completion order: ``{"rid", "status", "body"}`` (the OpenAI
route's status and body) or ``{"rid", "aborted": true}``. The lines run through this server's own
in-process path (`server.in_process`): validated by SGLang's request model, converted once, run.
A client that goes away takes its unfinished lines with it (SGLang releases them);
``POST /sgl_blend/lines/abort`` with ``{"rids": [...]}`` stops some of them.

The route takes the keys the server takes (SGLang's ``--api-key`` and ``--admin-api-key``, and the
Batch API's own keys when it is on) as a Bearer token when any is set, as the server's other routes
do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sgl_blend.batch_lines.lines import SUPPORTED_URLS, BatchLine, parse_record
from sgl_blend.server.auth import BatchKeys
from sgl_blend.server.errors import ApiError

LINES_PATH = "/sgl_blend/lines"
ABORT_PATH = "/sgl_blend/lines/abort"
LINE_ROUTE_PREFIX = "/sgl_blend"


def line_route_app(engine: Callable[[], Any], keys: BatchKeys) -> Starlette:
    """``engine``: this server's `InProcessEngine` once SGLang has started (None before);
    ``keys``: the keys the route takes (none: open)."""

    def refused(request: Request) -> Response | None:
        """A 401 for a request without one of ``keys`` (the Batch API's own bearer check)."""
        try:
            keys.caller(request.headers.get("authorization"))
        except ApiError:
            return JSONResponse({"error": {"message": "invalid API key", "type": "authentication_error"}}, 401)
        return None

    async def run_lines(request: Request) -> Response:
        if (refusal := refused(request)) is not None:
            return refusal
        running = engine()
        if running is None:
            return JSONResponse({"error": {"message": "the server is starting", "type": "unavailable"}}, 503)
        try:
            records = [json.loads(text) for text in (await request.body()).splitlines() if text.strip()]
            calls = [(str(record["rid"]), record) for record in records]
        except (ValueError, KeyError, TypeError) as error:
            return JSONResponse(
                {"error": {"message": f"malformed line chunk: {error}", "type": "invalid_request"}}, 400
            )
        return StreamingResponse(_answers(running, calls), media_type="application/x-ndjson")

    async def abort_lines(request: Request) -> Response:
        if (refusal := refused(request)) is not None:
            return refusal
        running = engine()
        try:
            rids = [str(rid) for rid in (await request.json())["rids"]]
        except (ValueError, KeyError, TypeError) as error:
            return JSONResponse({"error": {"message": f"malformed abort: {error}", "type": "invalid_request"}}, 400)
        if running is not None:
            running.abort(rids)
        return JSONResponse({"aborted": len(rids)})

    return Starlette(
        routes=[Route(LINES_PATH, run_lines, methods=["POST"]), Route(ABORT_PATH, abort_lines, methods=["POST"])]
    )


async def _answers(engine: Any, calls: list[tuple[str, dict[str, Any]]]) -> AsyncIterator[bytes]:
    """One JSON line per line, as each finishes; the lines still running when the client goes away
    are cancelled."""
    parsed = [
        (rid, record, parse_record(record, number, SUPPORTED_URLS))
        for number, (rid, record) in enumerate(calls, start=1)
    ]
    lines = [line for _rid, _record, line in parsed if isinstance(line, BatchLine)]
    converted = iter(await asyncio.to_thread(engine.convert, lines) if lines else [])
    finished: asyncio.Queue[bytes] = asyncio.Queue()
    tasks = []
    for rid, record, line in parsed:
        if not isinstance(line, BatchLine):
            finished.put_nowait(_answer_line(rid, (400, {"error": {"message": line.message, "type": line.code}})))
            continue
        tasks.append(asyncio.create_task(_run(engine, rid, record, line, next(converted).stored, finished)))
    try:
        for _index in range(len(parsed)):
            yield await finished.get()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run(
    engine: Any, rid: str, record: dict[str, Any], line: BatchLine, stored: bytes, finished: asyncio.Queue[bytes]
) -> None:
    dp_rank = record.get("dp_rank")
    try:
        answer = await engine.answer(
            line.url,
            stored,
            rid=rid,
            routing_key=record.get("routing_key"),
            dp_rank=int(dp_rank) if dp_rank is not None else None,
        )
    except Exception as error:  # every line gets an answer, or the stream would wait for it forever
        answer = (500, {"error": {"message": f"the line failed in this server: {error}", "type": "internal"}})
    finished.put_nowait(_answer_line(rid, answer))


def _answer_line(rid: str, answer: tuple[int, Any] | None) -> bytes:
    if answer is None:
        return json.dumps({"rid": rid, "aborted": True}).encode() + b"\n"
    status, body = answer
    return json.dumps({"rid": rid, "status": status, "body": body}, ensure_ascii=False).encode() + b"\n"
