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

BROS runs without the radix cache (as ``--colocation bros`` does), so shared prefixes are
recomputed; its scheduler predicts with the fitted ``bros`` form, never with the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sgl_blend.core.bros.cost import IterationCost, SwapModel
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


def run_bros(
    online: Sequence[OnlineArrival],
    offline: Sequence[SimRequest],
    device: ClockDevice,
    cost: IterationCost,
    settings: SimSettings,
    horizon_s: float,
    policy: str = "bros",
) -> ColocatedResult:
    """Serve ``online`` (RT) beside ``offline`` (BE) with a `bros_engine` policy until every
    online request is done and ``horizon_s`` has passed."""
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
    summary = simulate(policy, arrivals, device, cost, run_settings, be_source=pool, listeners=[recorder])
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
