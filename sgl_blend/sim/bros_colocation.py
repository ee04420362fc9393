"""BROS on the co-location benchmark's workload: online arrivals as RT, the offline pool as BE.

The co-location simulator (`sim.colocation`) and the BROS simulator (`sim.bros_engine`) run
different loops because BROS rebuilds every batch from scratch and owns its KV layout. To judge
BROS beside HyGen and Echo, this adapter feeds `bros_engine.simulate` exactly what the other
configurations get -- the same online arrivals, the same offline pool (in its order, each request
once), the same measured iteration times (the clock, with BROS's swap time beside it) -- and
reads the answer the same way: one `RequestTiming` per online arrival, and offline tokens as
``(time, tokens)`` events, a request's prompt counted once when its first token appears and each
output token once (recomputation after a drop counts nothing), so
`ColocatedResult.offline_tokens_per_s` means the same thing for every configuration.

By default BROS runs without the radix cache (as ``--colocation bros`` does), so shared prefixes
are recomputed; with ``radix_cache`` (the engine run with SGLang's radix cache kept) a line's
shared prompt segments are computed once (`SharedSegments`). Its scheduler predicts with the
fitted ``bros`` form, never with the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sgl_blend.core.bros.cost import IterationCost, SwapModel
from sgl_blend.core.bros.requests import BrosRequest
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.core.request_timing import RequestTiming
from sgl_blend.forward_time.step_time import IterationClock
from sgl_blend.sim.bros_engine import Arrival, BestEffortPool, SimSettings, simulate
from sgl_blend.sim.colocation import ColocatedResult, OnlineArrival
from sgl_blend.sim.workload import SimRequest


@dataclass
class ClockDevice:
    """The co-location simulator's clock as BROS's device: an iteration takes what the clock
    measures for its batch, or the swap, whichever is longer (swaps overlap the forward pass).
    ``busy_s`` adds up every iteration, for the engine's utilisation."""

    clock: IterationClock
    swap: SwapModel
    busy_s: float = 0.0

    def iteration_s(self, shape: BatchShape, swap_tokens: int) -> float:
        seconds = max(self.clock.measure(shape), self.swap.seconds(swap_tokens))
        self.busy_s += seconds
        return seconds


class _Recorder:
    """A `bros_engine.TokenListener` that writes what a co-location run reports."""

    def __init__(self, timings: dict[str, RequestTiming], prompt_lens: dict[str, int]) -> None:
        self.timings = timings
        self.prompt_lens = prompt_lens
        self.last: dict[str, float] = {}
        self.events: list[tuple[float, int]] = []
        self.output_events: list[tuple[float, int]] = []
        self.started: set[str] = set()
        self.offline_finished = 0

    def arrived(self, rid: str, realtime: bool, now: float) -> None:
        pass

    def received(self, rid: str, now: float) -> None:
        timing = self.timings[rid]
        timing.received = now - timing.sent_at

    def token(self, rid: str, now: float) -> None:
        timing = self.timings.get(rid)
        if timing is None:
            tokens = 1
            if rid not in self.started:
                self.started.add(rid)
                tokens += self.prompt_lens[rid]
            self.events.append((now, tokens))
            self.output_events.append((now, 1))
            return
        if timing.ttft is None:
            timing.ttft = now - timing.sent_at
        else:
            timing.gaps.append(now - self.last[rid])
        timing.tokens += 1
        self.last[rid] = now

    def finished(self, rid: str, now: float) -> None:
        if rid not in self.timings:
            self.offline_finished += 1


class SharedSegments:
    """SGLang's radix cache as the simulated BROS meets it: a BE line's shared prompt segments are
    in the cache once a line holding them has its first token (its prefill's forward is done), and
    a later line's prefill starts past the leading ones there. Nothing is evicted: the judge's
    10,000 trace1 lines share 60 segments of 44,723 tokens in all, 11% of the stock engine's pool
    on the emulated H100 (410,745 tokens). A `bros_engine.TokenListener`."""

    def __init__(self, offline: Sequence[SimRequest]) -> None:
        self.prefixes = {request.rid: request.prefix for request in offline}
        self.cached: set[str] = set()

    def arrived(self, rid: str, realtime: bool, now: float) -> None:
        pass

    def received(self, rid: str, now: float) -> None:
        pass

    def token(self, rid: str, now: float) -> None:
        # a line's first token: its prefix is computed, and its own prefill is behind it
        self.cached.update(key for key, _length in self.prefixes.pop(rid, ()))

    def finished(self, rid: str, now: float) -> None:
        pass

    def hit(self, request: BrosRequest) -> int:
        tokens = 0
        for key, length in self.prefixes.get(request.rid, ()):
            if key not in self.cached:
                break
            tokens += length
        return tokens


def run_bros(
    online: Sequence[OnlineArrival],
    offline: Sequence[SimRequest],
    device: ClockDevice,
    cost: IterationCost,
    settings: SimSettings,
    horizon_s: float,
    policy: str = "bros",
    radix_cache: bool = False,
) -> ColocatedResult:
    """Serve ``online`` (RT) beside ``offline`` (BE) with a `bros_engine` policy until every
    online request is done and ``horizon_s`` has passed; with ``radix_cache``, shared prompt
    segments are computed once (`SharedSegments`)."""
    ordered = sorted(online, key=lambda arrival: arrival.at)
    rids = [f"online-{index}" for index in range(len(ordered))]
    timings = {rid: RequestTiming(arrival.at) for rid, arrival in zip(rids, ordered)}
    arrivals = [
        Arrival(rid, arrival.at, arrival.request.prompt_len, arrival.request.output_len)
        for rid, arrival in zip(rids, ordered)
    ]
    recorder = _Recorder(timings, {request.rid: request.prompt_len for request in offline})
    pool = BestEffortPool([(request.rid, request.prompt_len, request.output_len) for request in offline])
    run_settings = replace(settings, duration_s=horizon_s, drain_realtime=True)
    shared = SharedSegments(offline) if radix_cache else None
    summary = simulate(
        policy,
        arrivals,
        device,
        cost,
        run_settings,
        be_source=pool,
        listeners=[recorder] if shared is None else [recorder, shared],
        cached_prefix=None if shared is None else shared.hit,
    )
    counts = {"offline_finished": recorder.offline_finished, "rt_unfinished": summary["rt_unfinished"]}
    if "checkpointed_tokens" in summary:
        counts["checkpointed_tokens"] = summary["checkpointed_tokens"]
    return ColocatedResult(
        horizon_s,
        summary["simulated_s"],
        [timings[rid] for rid in rids],
        recorder.events,
        summary["iterations"],
        0,
        counts,
        recorder.output_events,
    )
