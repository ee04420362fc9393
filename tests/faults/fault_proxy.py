"""A real HTTP proxy in front of a real server that injects transient faults into the lines a runner
sends through the line route (``POST /sgl_blend/lines``, whose answer streams one line at a time):
a 503 instead of a line's answer, the stream broken after the engine got the chunk (the lines not
yet answered never are), and an abort the client did not ask for (the answer as SGLang gives it
for an aborted request: ``finish_reason`` abort). Everything else -- ``/server_info``, aborts --
passes through untouched. It runs its own event loop in a thread of the test process."""

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
FAULTED_PATH = "/sgl_blend/lines"


@dataclass
class FaultProxy:
    """Forwards to ``target``; each line's answer meets a fault with probability ``rate``, the
    kinds taken in turn so that a run sees each of them."""

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
        headers = {name: value for name, value in request.headers.items() if name.lower() not in ("host",
                                                                                                  "content-length")}
        async with self._session.request(request.method, self.target + request.path_qs, data=body,
                                         headers=headers) as answer:
            content_type = answer.headers.get("Content-Type", "application/json")
            if request.method != "POST" or request.path != FAULTED_PATH or answer.status != 200:
                return web.Response(body=await answer.read(), status=answer.status,
                                    headers={"Content-Type": content_type})
            reply = web.StreamResponse(status=200, headers={"Content-Type": content_type})
            await reply.prepare(request)
            async for line in answer.content:
                fault = self._fault()
                if fault == "dropped":
                    request.transport.close()  # the engine ran the chunk; its unanswered lines are lost
                    return reply
                await reply.write(_faulted(line, fault))
            await reply.write_eof()
            return reply

    def _fault(self) -> str | None:
        self.seen["line"] += 1
        if self._random.random() >= self.rate:
            return None
        fault = FAULTS[sum(self.seen[kind] for kind in FAULTS) % len(FAULTS)]
        self.seen[fault] += 1
        return fault


def _faulted(line: bytes, fault: str | None) -> bytes:
    """One line's answer as the fault leaves it."""
    if fault is None or not line.strip():
        return line
    record = json.loads(line)
    if fault == "status_503":
        record.update(status=503, body={"object": "error", "message": "injected: service unavailable"})
    elif record.get("status") == 200:
        for choice in record["body"].get("choices", []):
            choice["finish_reason"] = "abort"
    return json.dumps(record).encode() + b"\n"
