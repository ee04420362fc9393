"""The worker servers a batch runner sends lines to, and the one HTTP client it reaches them with.

Workers are base URLs: this server, and any others `sgl-blend serve --batch-workers` names. Each
offers one slot per DP rank (its ``dp_size``, read from its ``/server_info``). A worker that gives
no answer is paused with a growing back-off (`client.http.Backoff`) and its lines wait; one that
stays unreachable for the grace period is declared dead, and is probed again at its back-off pace
until it answers ``/server_info`` once more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import httpx

from sgl_blend.client import http
from sgl_blend.batch_lines.lines import PreparedRequest
from sgl_blend.batch_lines.sender import LineOutcome, WorkerUnreachable, abort_requests, send_request
from sgl_blend.server.assignment import Slot, worker_slots

logger = logging.getLogger(__name__)
MAX_WORKER_BACKOFF_S = 10.0
WORKER_GRACE_S = 15.0
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EngineLimits:
    """What one of a worker's schedulers can hold at once, as its ``/server_info`` says: KV tokens
    and running requests (None where the server does not say)."""

    kv_tokens: int | None = None
    max_running: int | None = None

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> EngineLimits:
        states = info.get("internal_states") or [{}]
        state = states[0] if isinstance(states[0], Mapping) else {}
        tokens = (state.get("memory_usage") or {}).get("token_capacity")
        running = state.get("effective_max_running_requests_per_dp")
        return cls(int(tokens) if tokens else None, int(running) if running else None)

    def concurrent(self, footprint: float | None) -> int | None:
        """Requests of ``footprint`` KV tokens each (over their life) that run at once."""
        fits = int(self.kv_tokens / footprint) if self.kv_tokens and footprint else None
        bounds = [bound for bound in (fits, self.max_running) if bound]
        return max(1, min(bounds)) if bounds else None


@dataclass
class Worker:
    url: str
    dp_size: int | None = None  # None: not known to be alive (not probed yet, or declared dead)
    inflight: int = 0
    limits: EngineLimits = field(default_factory=EngineLimits)
    backoff: http.Backoff = field(default_factory=lambda: http.Backoff(max_s=MAX_WORKER_BACKOFF_S))

    @property
    def live(self) -> bool:
        return self.dp_size is not None

    def slots(self) -> list[Slot]:
        return worker_slots(self.url, self.dp_size) if self.dp_size is not None else []


class WorkerPool:
    """Every worker by URL, over one client with no cap of its own on requests in flight (the
    dispatcher's windows are the cap). ``on_change`` is called when a worker is declared dead
    (its lines must move)."""

    def __init__(self, urls: Sequence[str], *, api_key: str | None = None,
                 admin_api_key: str | None = None, grace_s: float = WORKER_GRACE_S,
                 on_change: Callable[[], None] = lambda: None) -> None:
        if not urls:
            raise ValueError("a batch runner needs at least one worker URL")
        self.workers = {url: Worker(url) for url in dict.fromkeys(urls)}
        self.grace_s = grace_s
        self._api_key = api_key
        # SGLang guards /abort_request with the admin key when one is set.
        self._abort_auth = http.auth_headers(admin_api_key or api_key)
        self._on_change = on_change
        self._client: httpx.AsyncClient | None = None

    def __getitem__(self, url: str) -> Worker:
        return self.workers[url]

    def open(self) -> None:
        self._client = http.async_client(key=self._api_key, max_connections=None)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def live_slots(self) -> list[Slot]:
        return [slot for worker in self.workers.values() for slot in worker.slots()]

    def ready(self) -> Iterator[Worker]:
        """The live workers that are not paused, each judged as the caller reaches it."""
        now = time.monotonic()
        return (worker for worker in self.workers.values() if worker.live and worker.backoff.ready(now))

    async def send(self, worker: Worker, custom_id: str, request: PreparedRequest, headers: Mapping[str, str],
                   rid: str, dp_rank: int | None) -> LineOutcome:
        """`send_request` to the worker; a `WorkerUnreachable` from it pauses the worker first."""
        try:
            outcome = await send_request(self._client, worker.url, custom_id, request, headers, rid, dp_rank=dp_rank)
        except WorkerUnreachable as error:
            self._failed(worker, error)
            raise
        worker.backoff.succeeded()
        return outcome

    async def abort(self, running: Iterable[tuple[str, str]]) -> None:
        """Abort (worker URL, SGLang request id) pairs, each worker's at once."""
        running = list(running)
        for url in self.workers:
            rids = [rid for worker, rid in running if worker == url]
            if rids:
                await abort_requests(self._client, url, rids, self._abort_auth)

    def _failed(self, worker: Worker, error: Exception) -> None:
        """Pause a worker that did not answer (down, or not listening yet); its lines wait and go
        again, since they never ran. One unreachable for the grace period is declared dead."""
        now = time.monotonic()
        pause = worker.backoff.failed(now)
        if worker.live and worker.backoff.failing_for(now) >= self.grace_s:
            logger.warning("worker %s unreachable for %.0f s; declaring it dead: %s", worker.url,
                           worker.backoff.failing_for(now), error)
            worker.dp_size = None
            self._on_change()
        else:
            logger.info("worker unreachable, retrying in %.1f s: %s", pause, error)

    async def probe(self) -> None:
        """Ask each worker not known to be alive for its ``/server_info`` (at its back-off pace): one
        that answers is alive, with as many slots as it has DP ranks."""
        now = time.monotonic()
        waiting = [worker for worker in self.workers.values() if not worker.live and worker.backoff.ready(now)]
        for worker, info in zip(waiting, await asyncio.gather(*(self._server_info(worker) for worker in waiting))):
            if info is None:
                worker.backoff.failed(now)
                continue
            worker.dp_size, worker.limits = http.dp_size(info), EngineLimits.of(info)
            worker.backoff.succeeded()
            logger.info("worker %s is alive with %d DP rank(s)", worker.url, worker.dp_size)

    async def _server_info(self, worker: Worker) -> dict[str, Any] | None:
        try:
            return await http.server_info_async(self._client, worker.url, timeout=PROBE_TIMEOUT_S)
        except (http.NoAnswer, httpx.HTTPStatusError, ValueError):
            return None
