"""What one online request's client saw, and the latency figures co-location is judged by.

Both a live server (`measure.online_replay` streaming real requests) and the co-location
simulators (`sim.colocation`, `sim.bros_colocation`) record their online requests as
`RequestTiming`s, so one `summarize` judges a simulated run and a measured one the same way; it
lives in the core because both sides build on it and neither may depend on the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestTiming:
    """``ttft`` and ``gaps`` (between tokens) in seconds from ``sent_at``; ``error`` set when the
    request did not complete. ``received``, seconds from ``sent_at`` until the engine's loop took
    the request in, is known to a simulator (a client cannot see it): a measured front end, whose
    way to the scheduler ends at that same point, replaces the simulated wait before it."""

    sent_at: float
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None
    received: float | None = None


def summarize(timings: Sequence[RequestTiming]) -> dict[str, float]:
    """Mean and P99 TTFT and TBT, in seconds, over the requests that completed."""
    done = [timing for timing in timings if timing.error is None and timing.ttft is not None]
    ttfts = [timing.ttft for timing in done if timing.ttft is not None]
    gaps = [gap for timing in done for gap in timing.gaps]
    summary: dict[str, float] = {"requests": len(timings), "completed": len(done), "errors": len(timings) - len(done)}
    for name, values in (("ttft", ttfts), ("tbt", gaps)):
        summary[f"{name}_mean"] = float(np.mean(values)) if values else math.inf
        summary[f"{name}_p99"] = float(np.percentile(values, 99)) if values else math.inf
    return summary
