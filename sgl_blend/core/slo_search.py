"""HyGen's SLO-aware profiler (§4.2): the largest per-iteration latency budget that meets the SLOs.

Larger budgets admit more offline work per iteration, so online latency grows with the budget;
`search_budget` bisects (in log space: budgets span orders of magnitude) between a budget
known to be safe and one known to be too large. Every SLO must hold at the chosen budget, so
with several SLOs the tightest one decides; the result names it. The same search finds any knob
that trades offline work for online latency (an offline release rate, a scale on a scheduler's
own SLOs); `steps_for` sizes it by the resolution wanted rather than by a count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

METRICS = ("ttft_mean", "ttft_p99", "tbt_mean", "tbt_p99")


@dataclass(frozen=True)
class SLO:
    """``metric`` must stay at or below ``target_s`` times ``1 + tolerance``."""

    metric: str
    target_s: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown SLO metric {self.metric!r}; known: {', '.join(METRICS)}")
        if not self.target_s > 0:
            raise ValueError(f"SLO {self.metric} needs a positive target, got {self.target_s}")

    def limit(self, tolerance: float) -> float:
        return self.target_s * (1.0 + tolerance)


@dataclass
class SearchStep:
    budget_s: float
    metrics: dict[str, float]
    violated: list[str]


@dataclass
class SearchResult:
    """``budget_s`` is the largest budget tried that met every SLO (None: not even the lowest);
    ``binding`` the SLOs the smallest failing budget violated."""

    budget_s: float | None
    binding: list[str]
    steps: list[SearchStep] = field(default_factory=list)


def violations(metrics: dict[str, float], slos: Sequence[SLO], tolerance: float) -> list[str]:
    return [slo.metric for slo in slos if not metrics.get(slo.metric, math.inf) <= slo.limit(tolerance)]


def steps_for(low: float, high: float, resolution: float) -> int:
    """Bisection steps after both ends until the bracket's high/low ratio is at most
    ``resolution``: each log-space step takes the square root of the ratio."""
    if not (0 < low < high and resolution > 1):
        raise ValueError(f"need 0 < low < high and resolution > 1, got {low}, {high}, {resolution}")
    ratio, steps = high / low, 0
    while ratio > resolution:
        ratio, steps = math.sqrt(ratio), steps + 1
    return steps


def search_budget(
    evaluate: Callable[[float], dict[str, float]],
    slos: Sequence[SLO],
    tolerance: float,
    low_s: float,
    high_s: float,
    steps: int,
) -> SearchResult:
    """Bisect on ``evaluate(budget) -> metrics``, assuming latency grows with the budget."""
    if not slos:
        raise ValueError("give at least one SLO")
    if not 0 < low_s < high_s:
        raise ValueError(f"need 0 < low < high, got low={low_s}, high={high_s}")
    result = SearchResult(None, [])

    def trial(budget: float) -> bool:
        metrics = evaluate(budget)
        failed = violations(metrics, slos, tolerance)
        result.steps.append(SearchStep(budget, metrics, failed))
        if failed and (not result.binding or budget <= min(s.budget_s for s in result.steps if s.violated)):
            result.binding = failed
        return not failed

    if trial(high_s):
        result.budget_s = high_s
        return result
    if not trial(low_s):
        return result
    good, bad = low_s, high_s
    for _ in range(steps):
        middle = math.sqrt(good * bad)
        if trial(middle):
            good = middle
        else:
            bad = middle
    result.budget_s = good
    return result
