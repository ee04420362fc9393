"""Online and offline load against a live server, measured as the simulators measure theirs.

- An online trace is a JSONL file of ``{"t": seconds_from_start, "prompt": text, "max_tokens": n}``;
  `replay` sends each request at its time, streaming, and records its time to first token and
  the gaps between tokens (a chunk that carries k tokens counts as k gaps of a k-th of its wait).
- `OfflineLoad` keeps a fixed number of offline requests in flight (closed loop) from a set of
  OpenAI batch lines, cycling through them, or sends them at a fixed rate (open loop, the
  "fixed offline rate" baseline), and counts completed output tokens over time.

Both are the measuring side of `sgl-blend tune-slo` and of the co-location benchmark. The timings
and their summary are `core.request_timing`'s, shared with the simulators; `summarize` is
re-exported here for the callers that replay and judge in one place.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from sgl_blend.batch_lines.lines import BatchLine
from sgl_blend.client import http
from sgl_blend.core.request_timing import RequestTiming, summarize  # noqa: F401 (re-exported)
from sgl_blend.offline import offline_headers

OFFLINE_JOB = "colocation-load"


def fresh_connections(base_url: str, headers: Mapping[str, str] | None = None) -> httpx.AsyncClient:
    """A client with no limit on requests or time that opens a connection per request (a measured
    request must not fail on a connection the server's keep-alive timer is closing)."""
    return http.async_client(base_url, max_connections=None, keep_alive=False, timeout=None, headers=headers)


@dataclass(frozen=True)
class OnlineRequest:
    t: float
    prompt: str
    max_tokens: int


def load_trace(path: Path) -> list[OnlineRequest]:
    """Read a trace; a malformed line is an error naming the line, nothing is skipped silently."""
    requests = []
    with Path(path).open() as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
                requests.append(OnlineRequest(float(record["t"]), str(record["prompt"]), int(record["max_tokens"])))
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(
                    f"{path}:{number}: not a trace line ({error!r}); expected "
                    '{"t": seconds, "prompt": text, "max_tokens": n}'
                ) from None
    return sorted(requests, key=lambda request: request.t)


async def _stream_one(
    client: httpx.AsyncClient, request: OnlineRequest, timing: RequestTiming, priority: int | None
) -> None:
    body = {
        "text": request.prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": request.max_tokens, "temperature": 0, "ignore_eos": True},
        **({"priority": priority} if priority is not None else {}),
    }
    last = timing.sent_at
    try:
        async with client.stream("POST", "/generate", json=body) as response:
            if response.status_code != 200:
                timing.error = f"HTTP {response.status_code}"
                return
            async for line in response.aiter_lines():
                line = line.strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                tokens = int(chunk.get("meta_info", {}).get("completion_tokens", timing.tokens + 1))
                now = time.perf_counter()
                new = tokens - timing.tokens
                if new <= 0:
                    continue
                if timing.ttft is None:
                    timing.ttft = now - timing.sent_at
                    new -= 1
                if new > 0:
                    timing.gaps.extend([(now - last) / new] * new)
                timing.tokens = tokens
                last = now
    except http.NoAnswer as error:
        timing.error = f"{type(error).__name__}: {error}"


async def replay(base_url: str, trace: Sequence[OnlineRequest], priority: int | None = None) -> list[RequestTiming]:
    """Send the trace on time and wait for every answer; ``priority`` is SGLang's request
    priority, for a server run with ``--enable-priority-scheduling``."""
    timings: list[RequestTiming] = []
    async with fresh_connections(base_url) as client:
        start = time.perf_counter()
        tasks = []
        for request in trace:
            delay = start + request.t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            timing = RequestTiming(sent_at=time.perf_counter())
            timings.append(timing)
            tasks.append(asyncio.create_task(_stream_one(client, request, timing, priority)))
        await asyncio.gather(*tasks)
    return timings


class OfflineLoad:
    """Offline requests from batch lines, sent as offline work, closed loop or at a fixed rate."""

    def __init__(
        self,
        base_url: str,
        lines: Sequence[BatchLine],
        *,
        concurrency: int = 64,
        rate_per_s: float | None = None,
        priority: int | None = None,
    ) -> None:
        if not lines:
            raise ValueError("the offline load needs at least one batch line")
        self.base_url = base_url
        self.lines = lines
        self.priority = priority
        self.concurrency = concurrency
        self.rate_per_s = rate_per_s
        self.completions: list[tuple[float, int]] = []
        self.errors = 0
        self._task: asyncio.Task | None = None
        self.started_at = 0.0

    async def _send(self, client: httpx.AsyncClient, line: BatchLine) -> None:
        body = line.body if self.priority is None else {**line.body, "priority": self.priority}
        try:
            response = await client.post(line.url, json=body)
            body = response.json()
        except (http.NoAnswer, ValueError):
            self.errors += 1
            return
        if response.status_code != 200:
            self.errors += 1
            return
        self.completions.append((time.perf_counter(), int((body.get("usage") or {}).get("completion_tokens", 0))))

    async def _run(self) -> None:
        async with fresh_connections(self.base_url, offline_headers(OFFLINE_JOB)) as client:
            window = asyncio.Semaphore(self.concurrency)
            pending: set[asyncio.Task] = set()
            index = 0
            try:
                while True:
                    if self.rate_per_s is not None:
                        await asyncio.sleep(1.0 / self.rate_per_s)
                    await window.acquire()
                    task = asyncio.create_task(self._send(client, self.lines[index % len(self.lines)]))
                    task.add_done_callback(lambda _done: window.release())
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    index += 1
            finally:
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    def start(self) -> None:
        self.started_at = time.perf_counter()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def tokens_between(self, start: float, end: float) -> int:
        return sum(tokens for at, tokens in self.completions if start <= at < end)


async def replay_with_offline(
    base_url: str,
    trace: Sequence[OnlineRequest],
    offline: OfflineLoad | None,
    warmup_s: float = 2.0,
    priority: int | None = None,
) -> tuple[list[RequestTiming], dict[str, float]]:
    """Replay ``trace`` while ``offline`` keeps the engine busy; returns the online timings and the
    offline output throughput over the replay window."""
    if offline is not None:
        offline.start()
        await asyncio.sleep(warmup_s)
    start = time.perf_counter()
    try:
        timings = await replay(base_url, trace, priority)
    finally:
        end = time.perf_counter()
        if offline is not None:
            await offline.stop()
    tokens = offline.tokens_between(start, end) if offline is not None else 0
    return timings, {
        "offline_tokens": tokens,
        "offline_tokens_per_s": tokens / max(end - start, 1e-9),
        "window_s": end - start,
        "start": start,
    }
