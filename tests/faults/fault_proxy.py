"""A real HTTP proxy in front of a real server that injects transient faults into generation
requests: a 503 instead of the answer, a connection dropped after the engine got the request, and
an abort the client did not ask for (the answer as SGLang gives it for an aborted request:
``finish_reason`` abort). Everything else -- ``/server_info``, ``/abort_request`` -- passes
through untouched. It runs its own event loop in a thread of the test process."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from tests.conftest import free_port

FAULTS = ("status_503", "dropped", "aborted")
FAULTED_PATHS = ("/v1/chat/completions", "/v1/completions")


@dataclass
class FaultProxy:
    """Forwards to ``target``; each generation request meets a fault with probability ``rate``,
    the kinds taken in turn so that a run sees each of them."""

    target: str
    rate: float
    seed: int = 0
    seen: Counter[str] = field(default_factory=Counter)
    url: str = ""
    _random: random.Random = field(init=False)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _session: aiohttp.ClientSession | None = None
    _failed: Exception | None = None

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def __enter__(self) -> FaultProxy:
        port, started = free_port(), threading.Event()
        self.url = f"http://127.0.0.1:{port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(port, started), daemon=True)
        self._thread.start()
        started.wait()
        if self._failed is not None:
            raise RuntimeError("the fault proxy did not start") from self._failed
        return self

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def _serve(self, port: int, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            runner = self._loop.run_until_complete(self._start(port))
        except Exception as error:  # the test thread is told, instead of waiting forever
            self._failed = error
            return
        finally:
            started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._session.close())
        self._loop.run_until_complete(runner.cleanup())

    async def _start(self, port: int) -> web.AppRunner:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return runner

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        fault = None
        if request.method == "POST" and request.path in FAULTED_PATHS:
            self.seen["generation"] += 1
            if self._random.random() < self.rate:
                fault = FAULTS[sum(self.seen[kind] for kind in FAULTS) % len(FAULTS)]
                self.seen[fault] += 1
        if fault == "status_503":
            return web.json_response({"object": "error", "message": "injected: service unavailable"}, status=503)
        headers = {name: value for name, value in request.headers.items() if name.lower() not in ("host",
                                                                                                  "content-length")}
        async with self._session.request(request.method, self.target + request.path_qs, data=body,
                                         headers=headers) as answer:
            data = await answer.read()
            status, content_type = answer.status, answer.headers.get("Content-Type", "application/json")
        if fault == "dropped":
            request.transport.close()  # the engine ran it; the client never hears
            return web.Response(status=500)
        if fault == "aborted" and status == 200:
            reply = json.loads(data)
            for choice in reply.get("choices", []):
                choice["finish_reason"] = "abort"
            data = json.dumps(reply).encode()
        return web.Response(body=data, status=status, headers={"Content-Type": content_type})
