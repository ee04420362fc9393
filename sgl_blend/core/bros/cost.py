"""BROS's iteration cost (§IV-A): ``max(t_exec, t_swap)``, plus the host's time between forwards.

``t_exec`` is the per-phase form ``a0 L_n + a1 L_n L_a + b`` that `latency_model` already fits
(form ``bros``, prefill and decode summed). ``t_swap`` is a linear model of host-to-device copy
time fitted on measured copies (``kernels/transfer.py``): the KV tokens a batch must bring back
from host memory. Swaps run asynchronously beside the forward pass, so they only cost time when
they are the longer of the two.

The paper prices the device alone. An RT request's next token comes one launch-to-launch period
later, and on a host that does not keep up that period is mostly the host's: result processing,
streaming and scheduling, per request in the batch. On the emulated H100 over a 2-core host a
BROS batch of about 250 requests came back 59 ms after its launch at the median, 46 ms of it the
host's gap after the forward: about 19 ms plus 0.14 ms a request (docs/colocation-history.md,
"BROS at its own SLO"). `HostTime` learns that time from the engine's own periods, so the budget
test sees it.

A mean is not what an attainment SLO asks for: a plan that fills its deadline with the mean
period misses it whenever the period runs long. On that host, with every plan predicted within
its budget, 5-10% of the periods with RT requests in them ran over it. `PeriodTail` learns how far
measured periods run past their plans' means, and a plan asked to (``bros_tail_quantile``, off
by default as in the paper) keeps that margin free. On the 2-core host at 0.99 it cut those
overruns to about 2% and the P99 of those periods from 124-157 to 100-122 ms, but moved the
client's P99 TTFT the other way, through the host's way out (docs/colocation-history.md,
"BROS planning to the tail of its periods"). On a device whose periods match the model the
margin is about 0.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sgl_blend.core.host_gap import HostTime
from sgl_blend.core.latency_model import BatchShape, LatencyModel


@dataclass(frozen=True)
class SwapModel:
    """``seconds = setup_s + tokens · bytes_per_token / bytes_per_s`` for host-to-device copies."""

    bytes_per_token: float
    bytes_per_s: float
    setup_s: float = 0.0

    def __post_init__(self) -> None:
        if self.bytes_per_token <= 0 or self.bytes_per_s <= 0 or self.setup_s < 0:
            raise ValueError("a swap model needs positive bytes per token and bandwidth, and a non-negative setup")

    def seconds(self, tokens: int) -> float:
        return 0.0 if tokens <= 0 else self.setup_s + tokens * self.bytes_per_token / self.bytes_per_s

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, float]], bytes_per_token: float) -> SwapModel:
        """Least squares on measured ``(bytes, seconds)`` copies; a negative intercept (noise on
        small copies) is clipped to zero and the slope refitted through the origin."""
        if len(samples) < 2:
            raise ValueError("fitting a swap model needs at least two timed copies")
        sizes = np.asarray([size for size, _ in samples], dtype=float)
        times = np.asarray([seconds for _, seconds in samples], dtype=float)
        slope, intercept = np.polyfit(sizes, times, 1)
        if intercept < 0 or slope <= 0:
            slope, intercept = float(np.dot(sizes, times) / np.dot(sizes, sizes)), 0.0
        return cls(bytes_per_token, 1.0 / float(slope), float(intercept))


# Periods `PeriodTail` remembers: at BROS's 17 iterations a second on the 2-core host about a
# minute, so its P99 rests on the ten longest overruns rather than on one.
TAIL_WINDOW = 1000


class PeriodTail:
    """The plan's margin: the ``quantile`` of measured minus predicted periods over the last
    ``window`` iterations, never below 0 (a model that over-predicts keeps that slack; the plan
    never packs past its own mean). A quantile of 0.99 keeps 99% of the periods within their
    deadlines: the RT attainment BROS's goal asks."""

    def __init__(self, quantile: float, window: int = TAIL_WINDOW) -> None:
        if not 0.0 < quantile < 1.0 or window < 1:
            raise ValueError(f"a period tail needs a quantile in (0, 1) and a window >= 1, got {quantile}, {window}")
        self.quantile = quantile
        self._recent: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []

    def observe(self, predicted_s: float, period_s: float) -> None:
        if len(self._recent) == self._recent.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self._recent[0])]
        overrun = period_s - predicted_s
        self._recent.append(overrun)
        bisect.insort(self._sorted, overrun)

    def seconds(self) -> float:
        if not self._sorted:
            return 0.0
        index = min(int(self.quantile * len(self._sorted)), len(self._sorted) - 1)
        return max(self._sorted[index], 0.0)


@dataclass(frozen=True)
class IterationCost:
    """The cost model ``C`` of Alg. 1: predicted seconds of one iteration, launch to launch, with
    the tail's margin when one is learnt (`margin_s`; `mean` is the prediction without it)."""

    model: LatencyModel
    swap: SwapModel | None = None
    host: HostTime | None = None
    tail: PeriodTail | None = None

    def mean(self, shape: BatchShape, swap_tokens: int = 0) -> float:
        execute = self.model.predict(shape)
        if self.swap is not None:
            execute = max(execute, self.swap.seconds(swap_tokens))
        if self.host is None:
            return execute
        return execute + self.host.seconds(shape.requests)

    def margin_s(self) -> float:
        return 0.0 if self.tail is None else self.tail.seconds()

    def predict(self, shape: BatchShape, swap_tokens: int = 0) -> float:
        return self.mean(shape, swap_tokens) + self.margin_s()
