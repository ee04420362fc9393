"""Putting the Batch API into SGLang's own FastAPI app, before SGLang starts serving it.

The routes join SGLang's app, so they share its host, port and ``--api-key`` middleware (which
guards every route of the app). The runner starts inside SGLang's lifespan, after SGLang's own
start-up, and stops before SGLang's shutdown.
"""

from __future__ import annotations

import asyncio
import socket
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import FastAPI

from sgl_blend.server.assignment import Assigner, split_evenly
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.config import BatchApiConfig
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

    context = ApiContext(config, store, blobs, wake_runner=wake_runners)
    app.include_router(build_router(context))
    app.add_exception_handler(ApiError, api_error_handler)
    sglang_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with sglang_lifespan(app_) as state:
            runner = BatchRunner(store, blobs, workers=(self_url, *config.workers), assigner=assigner,
                                 worker_grace_s=config.worker_grace_s,
                                 owner=f"{socket.gethostname()}:{self_url.rsplit(':', 1)[1]}", api_key=api_key,
                                 admin_api_key=admin_api_key,
                                 max_inflight=config.max_inflight, max_file_lines=config.max_file_lines,
                                 max_line_bytes=config.max_line_bytes, planner=planner, tokenizer=tokenizer)
            runners.append(runner)
            task = asyncio.create_task(runner.run())
            try:
                yield state
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                runners.remove(runner)

    app.router.lifespan_context = lifespan
