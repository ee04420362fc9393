"""Online arrival times: Poisson at a fixed rate, or bursty with 3x swings (HyGen's online loads).

A bursty trace keeps the same mean rate but alternates 1.5x and 0.5x of it every half period, so
the load swings 3x within minutes. Both are Poisson processes (the bursty one by thinning), so
the real-engine and the simulator benchmarks draw arrivals the same way.
"""

from __future__ import annotations

import random
from collections.abc import Callable

PATTERNS = ("poisson", "bursty")
BURST_HIGH, BURST_LOW = 1.5, 0.5


def poisson_times(rate_at: Callable[[float], float], peak: float, duration_s: float, seed: int) -> list[float]:
    """A Poisson process with rate ``rate_at(t)``, by thinning one of rate ``peak``."""
    rng = random.Random(seed)
    times: list[float] = []
    now = 0.0
    while True:
        now += rng.expovariate(peak)
        if now >= duration_s:
            return times
        if rng.random() < rate_at(now) / peak:
            times.append(now)


def arrival_times(pattern: str, rate: float, duration_s: float, period_s: float, seed: int) -> list[float]:
    """``poisson`` at ``rate``, or ``bursty``: the same mean rate, 1.5x and 0.5x alternating."""
    if pattern == "poisson":
        return poisson_times(lambda _t: rate, rate, duration_s, seed)
    if pattern == "bursty":
        return poisson_times(
            lambda t: rate * (BURST_HIGH if (t % period_s) < period_s / 2 else BURST_LOW),
            BURST_HIGH * rate,
            duration_s,
            seed,
        )
    raise ValueError(f"unknown arrival pattern {pattern!r}; known: {', '.join(PATTERNS)}")
