"""The worker servers a batch runner runs lines on, and how it reaches each (`server.transports`).

Workers are named by base URL: this server, whose engine the runner calls in-process, and any
others `sgl-blend serve --batch-workers` names, reached through their line route over one HTTP
client. Each offers one slot per DP rank (its ``dp_size``). A worker that gives no answer is
paused with a growing back-off (`client.http.Backoff`) and its lines wait; one that stays
unreachable for the grace period is declared dead, and is probed again at its back-off pace
until it answers ``/server_info`` once more.

A line that meets something transient -- an engine 5xx, 408 or 429, an abort the runner did not
ask for, a connection lost or timed out before the answer -- is tried again on its worker after a
growing, jittered pause (tenacity), each time under a new request id (an earlier try may still be
inside the engine). When the tries run out, who is at fault decides: if the worker answered other
lines meanwhile, the line's own request is what keeps failing and the line fails with its last
answer; if not, the worker is (down, overloaded, restarting), and the line goes back to wait for
it or, once the worker is declared dead, to move to another.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from sgl_blend.batch_lines.lines import error_record
from sgl_blend.batch_lines.outcome import AnswerLost, LineOutcome, LineUsage, WorkerUnreachable, aborted_outcome
from sgl_blend.client import http
from sgl_blend.emulation.config import STATE_KEY
from sgl_blend.server.assignment import Slot, worker_slots
from sgl_blend.server.in_process import InProcessEngine
from sgl_blend.server.prepared import PreparedLine
from sgl_blend.server.transports import InProcessTransport, LineCall, StreamTransport, Transport
from sgl_blend.server.window import RankLoad, concurrent_requests

logger = logging.getLogger(__name__)
MAX_WORKER_BACKOFF_S = 10.0
WORKER_GRACE_S = 15.0
# Tries of one line on its worker, and the pauses between them (doubling, with jitter): together
# about 15 s, so that a blip passes while the line waits, and a worker that is really down reaches
# its grace period through its other lines.
SEND_TRIES = 6
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 8.0


class _Transient(Exception):
    """A try's transient answer, raised so that tenacity tries again."""

    def __init__(self, outcome: LineOutcome) -> None:
        super().__init__(f"HTTP {outcome.status}" + (" (aborted)" if outcome.aborted else ""))
        self.outcome = outcome


@dataclass(frozen=True)
class EngineLimits:
    """What one of a worker's schedulers can hold at once, as its ``/server_info`` says: KV tokens
    and running requests (None where the server does not say), and whether it runs a co-location
    mode (its offline share is what online work leaves; `server.window.colocated_window`)."""

    kv_tokens: int | None = None
    max_running: int | None = None
    colocated: bool = False

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> EngineLimits:
        states = info.get("internal_states") or [{}]
        state = states[0] if isinstance(states[0], Mapping) else {}
        tokens = (state.get("memory_usage") or {}).get("token_capacity")
        running = state.get("effective_max_running_requests_per_dp")
        plugin = state.get(STATE_KEY)
        colocated = isinstance(plugin, Mapping) and bool(plugin.get("colocation") or plugin.get("bros"))
        return cls(int(tokens) if tokens else None, int(running) if running else None, colocated)

    def concurrent(self, footprint: float | None) -> int | None:
        """Requests of ``footprint`` KV tokens each (over their life) that run at once."""
        return concurrent_requests(self.kv_tokens, self.max_running, footprint)


@dataclass
class Worker:
    url: str
    transport: Transport
    dp_size: int | None = None  # None: not known to be alive (not probed yet, or declared dead)
    inflight: int = 0
    limits: EngineLimits = field(default_factory=EngineLimits)
    # Each DP rank's scheduler queue and running batch, as the engine last reported them (only
    # read for a co-locating engine).
    loads: dict[int, RankLoad] = field(default_factory=dict)
    backoff: http.Backoff = field(default_factory=lambda: http.Backoff(max_s=MAX_WORKER_BACKOFF_S))
    last_failure: Exception | None = None

    @property
    def live(self) -> bool:
        return self.dp_size is not None

    def slots(self) -> list[Slot]:
        return worker_slots(self.url, self.dp_size) if self.dp_size is not None else []


class WorkerPool:
    """Every worker by URL: ``engine`` (this server's, when the runner lives in one) runs the
    lines of ``local_url`` in-process; the others are reached over one HTTP client, whose few
    connections per worker carry chunks of lines. ``on_change`` is called when a worker is
    declared dead (its lines must move)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        engine: InProcessEngine | None = None,
        local_url: str | None = None,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        grace_s: float = WORKER_GRACE_S,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        if not urls:
            raise ValueError("a batch runner needs at least one worker URL")
        self._client = http.async_client(key=api_key, max_connections=None)
        abort_headers = http.auth_headers(admin_api_key or api_key)
        self.workers = {
            url: Worker(
                url,
                InProcessTransport(engine)
                if engine is not None and url == local_url
                else StreamTransport(url, self._client, abort_headers=abort_headers),
            )
            for url in dict.fromkeys(urls)
        }
        self.grace_s = grace_s
        self._on_change = on_change
        # Each line's request id as the dispatcher knows it -> the id of its try under way, and
        # the lines the runner aborted (their abort is final, never retried).
        self._trying: dict[str, str] = {}
        self._aborted: set[str] = set()

    def __getitem__(self, url: str) -> Worker:
        return self.workers[url]

    async def close(self) -> None:
        for worker in self.workers.values():
            await worker.transport.close()
        await self._client.aclose()

    def live_slots(self) -> list[Slot]:
        return [slot for worker in self.workers.values() for slot in worker.slots()]

    def ready(self) -> Iterator[Worker]:
        """The live workers that are not paused, each judged as the caller reaches it."""
        now = time.monotonic()
        return (worker for worker in self.workers.values() if worker.live and worker.backoff.ready(now))

    async def send(
        self, worker: Worker, custom_id: str, line: PreparedLine, routing_key: str, rid: str, dp_rank: int | None
    ) -> LineOutcome:
        """The line's outcome from the worker, tried again while what comes back is transient.
        Raises `WorkerUnreachable` when the worker cannot be reached, or is what keeps failing
        (the line never ran, or may run again: it goes back to wait or move); an abort the runner
        asked for (`abort`) is returned as it comes."""
        failed_at = 0.0

        def note_failure(state: RetryCallState) -> None:
            assert state.outcome is not None, "tenacity sleeps only after an attempt"
            logger.info(
                "line %s on %s: %s; trying again in %.1f s",
                custom_id,
                worker.url,
                state.outcome.exception(),
                state.upcoming_sleep,
            )

        try:
            try:  # the first try goes straight: most lines need no other, and tenacity costs a little per line
                return await self._try(worker, custom_id, line, routing_key, rid, 1, dp_rank)
            except (_Transient, AnswerLost) as first:
                failed_at = time.monotonic()
                if not worker.live or rid in self._aborted:
                    raise
                pause = RETRY_FIRST_S + random.uniform(0, RETRY_FIRST_S)
                logger.info("line %s on %s: %s; trying again in %.1f s", custom_id, worker.url, first, pause)
            await asyncio.sleep(pause)
            attempts = stop_after_attempt(SEND_TRIES - 1)

            def stop(state: RetryCallState) -> bool:
                return attempts(state) or not worker.live or rid in self._aborted

            retrying = AsyncRetrying(
                stop=stop,
                wait=wait_exponential(multiplier=2 * RETRY_FIRST_S, max=RETRY_MAX_S) + wait_random(0, RETRY_FIRST_S),
                retry=retry_if_exception_type((_Transient, AnswerLost)),
                before_sleep=note_failure,
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    return await self._try(
                        worker, custom_id, line, routing_key, rid, attempt.retry_state.attempt_number + 1, dp_rank
                    )
        except (_Transient, AnswerLost) as last:
            return self._gave_up(worker, custom_id, rid, last, failed_at)
        finally:
            self._trying.pop(rid, None)
            self._aborted.discard(rid)
        raise AssertionError("tenacity neither returned nor raised")

    async def _try(
        self,
        worker: Worker,
        custom_id: str,
        line: PreparedLine,
        routing_key: str,
        rid: str,
        number: int,
        dp_rank: int | None,
    ) -> LineOutcome:
        """One try, under the line's request id the first time and a fresh one after that."""
        if rid in self._aborted:
            return aborted_outcome(custom_id)
        self._trying[rid] = rid if number == 1 else f"{rid}-try{number}"
        try:
            outcome = await worker.transport.run(LineCall(custom_id, line, self._trying[rid], routing_key, dp_rank))
        except (WorkerUnreachable, AnswerLost) as error:
            self._failed(worker, error)
            raise
        if outcome.transient and not (outcome.aborted and rid in self._aborted):
            self._failed(worker, _Transient(outcome))
            raise _Transient(outcome)
        worker.backoff.succeeded()
        return outcome

    def _gave_up(self, worker: Worker, custom_id: str, rid: str, last: Exception, first_failure: float) -> LineOutcome:
        """The tries ran out (or the runner aborted the line, or its worker was declared dead)."""
        if rid in self._aborted:
            return aborted_outcome(custom_id)
        failing_since = worker.backoff.failing_since
        served_others = failing_since is None or failing_since > first_failure
        if not worker.live or not served_others:
            raise WorkerUnreachable(f"{worker.url} keeps failing ({last}); the line waits for it or moves") from last
        if isinstance(last, _Transient):
            return last.outcome
        return LineOutcome(
            False,
            error_record(
                custom_id,
                "no_answer",
                f"no answer after {SEND_TRIES} tries, while the server answered other lines: {last}",
            ),
            LineUsage(),
        )

    async def abort(self, running: Iterable[tuple[str, str]]) -> None:
        """Abort (worker URL, SGLang request id) pairs, each worker's at once: the try under way of
        each, and no try after it."""
        running = [(url, rid) for url, rid in running if rid in self._trying]
        self._aborted.update(rid for _url, rid in running)
        for url, worker in self.workers.items():
            rids = [self._trying[rid] for owner, rid in running if owner == url and rid in self._trying]
            if rids:
                await worker.transport.abort(rids)

    def _failed(self, worker: Worker, error: Exception) -> None:
        """Pause a worker that failed a line (down, not listening yet, or answering only errors);
        its lines wait. One that fails everything for the grace period is declared dead. The lines
        of one broken stream fail with one error, which is one failure of the worker."""
        if error is worker.last_failure:
            return
        worker.last_failure = error
        now = time.monotonic()
        pause = worker.backoff.failed(now)
        if worker.live and worker.backoff.failing_for(now) >= self.grace_s:
            logger.warning(
                "worker %s failing every line for %.0f s; declaring it dead: %s",
                worker.url,
                worker.backoff.failing_for(now),
                error,
            )
            worker.dp_size = None
            self._on_change()
        else:
            logger.info("worker %s failed a line; pausing it %.1f s: %s", worker.url, pause, error)

    async def look_at_queues(self) -> None:
        """Read each live co-locating worker's queues and running batches (SGLang's load report);
        one that does not answer keeps its last ones."""
        colocated = [worker for worker in self.workers.values() if worker.live and worker.limits.colocated]
        answers = await asyncio.gather(*(worker.transport.loads() for worker in colocated), return_exceptions=True)
        for worker, loads in zip(colocated, answers):
            if isinstance(loads, BaseException):
                logger.debug("worker %s did not say its queue: %s", worker.url, loads)
            elif loads is not None:
                worker.loads = loads

    async def probe(self) -> None:
        """Ask each worker not known to be alive what it is (at its back-off pace): one that
        answers is alive, with as many slots as it has DP ranks."""
        now = time.monotonic()
        waiting = [worker for worker in self.workers.values() if not worker.live and worker.backoff.ready(now)]
        for worker, info in zip(waiting, await asyncio.gather(*(worker.transport.info() for worker in waiting))):
            if info is None:
                worker.backoff.failed(now)
                continue
            worker.dp_size, worker.limits = http.dp_size(info), EngineLimits.of(info)
            worker.backoff.succeeded()
            logger.info("worker %s is alive with %d DP rank(s)", worker.url, worker.dp_size)
