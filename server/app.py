"""Putting sgl-blend's routes in front of SGLang's own FastAPI app, before SGLang starts serving it.

Two ASGI apps of their own answer their paths on SGLang's host and port ahead of SGLang's
middleware: the line route (`server.line_route`, on every sgl-blend server: other servers' runners
hand it lines) and, when configured, the Files and Batches routes (`batch_api_app`). SGLang's
middleware would decide for the Batch API wrongly: its ``--api-key`` middleware takes one key
(the Batch API takes several, each seeing its own files and batches, `server.auth`) and lets
everything through when only ``--admin-api-key`` is set, and its CORS middleware allows any
origin with credentials (`server.cross_origin`). With the Batch API, SGLang's ``--api-key``
middleware gives way to the key gate (`server.key_gate`) in front of SGLang's stack, which takes
the same keys as the Batch API on SGLang's routes. Inside SGLang's lifespan, after SGLang's own
start-up, the in-process engine is built on SGLang's OpenAI handlers and the batch runner starts
with it; the runner stops before SGLang's shutdown.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from sgl_blend.batch_lines.bodies import BodyCaps
from sgl_blend.server.assignment import Assigner, split_evenly
from sgl_blend.server.auth import BatchKeys
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.server.cross_origin import guard_browsers
from sgl_blend.server.errors import ApiError, api_error_handler
from sgl_blend.server.in_process import InProcessEngine
from sgl_blend.server.key_gate import KeyGate
from sgl_blend.server.key_redaction import RedactKeys
from sgl_blend.server.line_route import LINE_ROUTE_PREFIX, line_route_app
from sgl_blend.server.routes import ApiContext, build_router
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import BatchStore
from sgl_blend.sglang_plugin import sglang_boundary as sgl

if TYPE_CHECKING:
    from sgl_blend.batch_lines.plan import LinePlanner


def loopback_url(host: str, port: int) -> str:
    """Where this server answers itself: a wildcard bind is reached through loopback."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def install(
    app: FastAPI,
    config: BatchApiConfig | None,
    *,
    self_url: str,
    api_key: str | None,
    admin_api_key: str | None = None,
    self_key: str | None = None,
    assigner: Assigner = split_evenly,
    planner: LinePlanner | None = None,
) -> None:
    """Mount the line route and, with a ``config``, the Batch API and the key gate: the store is
    opened now (failing before SGLang loads a model if it cannot be), the runner starts with the
    app. The runner runs lines on this server in-process and on the configured workers through
    their line route, spread over their DP ranks by ``assigner``, in the global plan's order when a
    ``planner`` is given. ``self_key``: one more key the gate takes, that of SGLang's own requests
    to itself (its warm-up) when the operator gave SGLang no ``--api-key``."""
    engines: list[InProcessEngine] = []
    batch_keys = config.api_keys if config is not None else ()
    keys = BatchKeys(user_keys=tuple(key for key in (api_key, *batch_keys) if key), admin_key=admin_api_key)
    routes: dict[str, ASGIApp] = {LINE_ROUTE_PREFIX: line_route_app(lambda: engines[0] if engines else None, keys)}
    runners: list[BatchRunner] = []
    store = blobs = None
    gate: Callable[[ASGIApp], ASGIApp] | None = None
    if config is not None:
        store, blobs = BatchStore.open(config.store_url, config.data_dir), BlobDir(config.data_dir, named=config.named)

        def wake_runners() -> None:
            for runner in runners:
                runner.wake()

        batch_api = batch_api_app(ApiContext(config, store, blobs, wake_runner=wake_runners), keys)
        routes.update(dict.fromkeys(BATCH_API_PATHS, batch_api))
        sgl.replace_key_middleware(_gate_decides)
        gate = _key_gate(app, BatchKeys((*keys.user_keys, self_key), admin_api_key) if self_key else keys)
    put_in_front(app, routes, gate)
    sglang_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with sglang_lifespan(app_) as state:
            engine = InProcessEngine.of_app(app_)
            engines.append(engine)
            if config is None or store is None or blobs is None:
                yield state
                return
            runner = BatchRunner(
                store,
                blobs,
                workers=(self_url, *config.workers),
                engine=engine,
                assigner=assigner,
                worker_grace_s=config.worker_grace_s,
                owner=f"{socket.gethostname()}:{self_url.rsplit(':', 1)[1]}",
                api_key=next(iter(keys.user_keys), admin_api_key),  # workers take the same keys
                admin_api_key=admin_api_key,
                max_inflight=config.max_inflight,
                max_file_lines=config.max_file_lines,
                max_line_bytes=config.max_line_bytes,
                planner=planner,
                body_caps=BodyCaps(config.max_n, config.max_tokens),
            )
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


def _key_gate(app: FastAPI, keys: BatchKeys) -> Callable[[ASGIApp], ASGIApp]:
    """SGLang's stack behind the key gate, which keeps the admin levels SGLang gives its routes,
    with the keys taken out of what SGLang tells about itself."""
    every_key = (*keys.user_keys, *([keys.admin_key] if keys.admin_key else []))
    return lambda stack: KeyGate(RedactKeys(stack, every_key), keys, lambda scope: sgl.route_auth_level(app, scope))


def _gate_decides(app: FastAPI, *, api_key: str | None, admin_api_key: str | None) -> None:
    """Stands in for SGLang's ``add_api_key_middleware``: the key gate decides for SGLang's routes."""


def put_in_front(app: FastAPI, routes: dict[str, ASGIApp], gate: Callable[[ASGIApp], ASGIApp] | None = None) -> None:
    """Route each path prefix of ``routes`` to its app ahead of everything SGLang puts in its app's
    middleware stack (which SGLang completes only when it starts serving, so the stack is wrapped
    when it is built); the rest goes through ``gate`` (when given) to SGLang's stack."""
    build_sglang_stack = app.build_middleware_stack

    def build_stack() -> ASGIApp:
        sglang = build_sglang_stack()
        return _PathSplit(routes, gate(sglang) if gate is not None else sglang)

    app.build_middleware_stack = build_stack  # type: ignore[method-assign]


class _PathSplit:
    """ASGI: HTTP requests under one of ``routes``' prefixes go to its app, everything else
    (lifespan included) to SGLang's stack."""

    def __init__(self, routes: dict[str, ASGIApp], sglang: ASGIApp) -> None:
        self.routes, self.sglang = routes, sglang

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        for prefix, route in self.routes.items():
            if path == prefix or path.startswith(prefix + "/"):
                await route(scope, receive, send)
                return
        await self.sglang(scope, receive, send)
