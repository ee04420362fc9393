"""Putting the Batch API in front of SGLang's own FastAPI app, before SGLang starts serving it.

The Files and Batches routes are an ASGI app of their own (`batch_api_app`) that answers its paths
on SGLang's host and port ahead of SGLang's middleware, because SGLang's would decide for them
wrongly: its ``--api-key`` middleware takes one key (the Batch API takes several, each seeing its
own files and batches, `server.auth`) and lets everything through when only ``--admin-api-key``
is set, and its CORS middleware allows any origin with credentials (`server.cross_origin`). The
runner starts inside SGLang's lifespan, after SGLang's own start-up, and stops before SGLang's
shutdown.
"""

from __future__ import annotations

import asyncio
import socket
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from sgl_blend.batch_lines.bodies import BodyCaps
from sgl_blend.server.assignment import Assigner, split_evenly
from sgl_blend.server.auth import BatchKeys
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.server.cross_origin import guard_browsers
from sgl_blend.server.errors import ApiError, api_error_handler
from sgl_blend.server.routes import ApiContext, build_router
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import BatchStore

if TYPE_CHECKING:
    from sgl_blend.batch_lines.plan import LinePlanner
    from sgl_blend.batch_lines.tokenize import LineTokenizer


def loopback_url(host: str, port: int) -> str:
    """Where this server answers itself: a wildcard bind is reached through loopback."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def install_batch_api(app: FastAPI, config: BatchApiConfig, *, self_url: str, api_key: str | None,
                      admin_api_key: str | None = None, assigner: Assigner = split_evenly,
                      planner: LinePlanner | None = None, tokenizer: LineTokenizer | None = None) -> None:
    """Open the store (failing now, before SGLang loads a model, if it cannot be opened) and mount
    the routes; the runner starts with the app. It sends lines to this server and to the
    configured workers, spread over their DP ranks by ``assigner``, in the global plan's order
    when a ``planner`` is given; ``tokenizer`` is the served model's, for the prompts both read."""
    store = BatchStore.open(config.store_url, config.data_dir)
    blobs = BlobDir(config.data_dir)
    runners: list[BatchRunner] = []

    def wake_runners() -> None:
        for runner in runners:
            runner.wake()

    keys = BatchKeys(user_keys=tuple(key for key in (api_key, *config.api_keys) if key), admin_key=admin_api_key)
    put_in_front(app, batch_api_app(ApiContext(config, store, blobs, wake_runner=wake_runners), keys))
    sglang_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with sglang_lifespan(app_) as state:
            runner = BatchRunner(store, blobs, workers=(self_url, *config.workers), assigner=assigner,
                                 worker_grace_s=config.worker_grace_s,
                                 owner=f"{socket.gethostname()}:{self_url.rsplit(':', 1)[1]}", api_key=api_key,
                                 admin_api_key=admin_api_key,
                                 max_inflight=config.max_inflight, max_file_lines=config.max_file_lines,
                                 max_line_bytes=config.max_line_bytes, planner=planner, tokenizer=tokenizer,
                                 body_caps=BodyCaps(config.max_n, config.max_tokens))
            runners.append(runner)
            task = asyncio.create_task(runner.run())
            try:
                yield state
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                runners.remove(runner)

    app.router.lifespan_context = lifespan


BATCH_API_PATHS = ("/v1/files", "/v1/batches")


def batch_api_app(context: ApiContext, keys: BatchKeys) -> ASGIApp:
    """The Files and Batches routes on an app of their own, with their own key check, browser
    guard and OpenAI-shaped errors (no OpenAPI page: SGLang's app has one)."""
    api = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    api.include_router(build_router(context, keys))
    api.add_exception_handler(ApiError, api_error_handler)
    return guard_browsers(api, context.config.cors_origins)


def put_in_front(app: FastAPI, batch_api: ASGIApp) -> None:
    """Route the Batch API's paths to ``batch_api`` ahead of everything SGLang puts in its app's
    middleware stack (which SGLang completes only when it starts serving, so the stack is wrapped
    when it is built)."""
    build_sglang_stack = app.build_middleware_stack

    def build_stack() -> ASGIApp:
        return _PathSplit(batch_api, build_sglang_stack())

    app.build_middleware_stack = build_stack  # type: ignore[method-assign]


class _PathSplit:
    """ASGI: HTTP requests under `BATCH_API_PATHS` go to the Batch API, everything else (lifespan
    included) to SGLang's stack."""

    def __init__(self, batch_api: ASGIApp, sglang: ASGIApp) -> None:
        self.batch_api, self.sglang = batch_api, sglang

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if any(path == prefix or path.startswith(prefix + "/") for prefix in BATCH_API_PATHS):
            await self.batch_api(scope, receive, send)
        else:
            await self.sglang(scope, receive, send)
