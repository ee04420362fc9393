"""How the emulated co-location bench judges a load: absolute SLO targets from online-only, a
tolerance measured as online-only's own seed-to-seed spread, and a configuration that counts only
where it met the SLO on most evaluation seeds.

Why these rules. One online-only replay is a sample: another seed of the same arrival process
moves its P99 TTFT and TBT by a measurable amount. A tolerance smaller than that spread would fail
online-only itself on some seeds, and one typed in by hand could hide a real violation; so it is
the spread, computed. A baseline that missed the SLO bought its throughput with latency: comparing
a mode that met the SLO with it would flatter the baseline, so the judge refuses it (no ratio) and
says why.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SLO_METRICS = ("ttft_p99", "tbt_p99")
# Met on at least this share of the evaluation seeds (2 of 3).
MET_SHARE = 2 / 3


def slo_targets(references: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The absolute targets (seconds): each metric's median over online-only's evaluation seeds."""
    if not references:
        raise ValueError("the SLO targets need at least one online-only run")
    return {metric: statistics.median(run[metric] for run in references) for metric in SLO_METRICS}


def seed_spread(references: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each metric's seed-to-seed spread on online-only: ``(max - min) / min`` over the seeds."""
    if len(references) < 2:
        raise ValueError("a seed-to-seed spread needs online-only on at least two seeds")
    spread = {}
    for metric in SLO_METRICS:
        values = [run[metric] for run in references]
        if min(values) <= 0:
            raise ValueError(f"online-only {metric} is {min(values)}: no spread relative to it")
        spread[metric] = (max(values) - min(values)) / min(values)
    return spread


def tolerance(references: Sequence[Mapping[str, float]]) -> float:
    """The SLO tolerance: the largest seed-to-seed spread of any SLO metric."""
    return max(seed_spread(references).values())


def violated(run: Mapping[str, Any], targets: Mapping[str, float], tolerance_share: float) -> list[str]:
    """The SLO metrics ``run`` missed; a failed run misses them all."""
    if "failed" in run:
        return list(targets)
    return [metric for metric, target in targets.items() if not run[metric] <= target * (1 + tolerance_share)]


@dataclass(frozen=True)
class Verdict:
    """One configuration at one load over its evaluation seeds."""

    config: str
    seeds_met: int
    seeds: int
    offline_tokens_per_s: float
    """The mean over seeds of the run figure the judge scores throughput on (`verdict`'s ``throughput``)."""

    @property
    def met(self) -> bool:
        return self.seeds > 0 and self.seeds_met >= MET_SHARE * self.seeds

    def to_dict(self) -> dict[str, Any]:
        return {
            "seeds_met": self.seeds_met,
            "seeds": self.seeds,
            "met": self.met,
            "offline_tokens_per_s": round(self.offline_tokens_per_s, 1),
        }


def verdict(
    config: str,
    runs: Sequence[Mapping[str, Any]],
    targets: Mapping[str, float],
    tolerance_share: float,
    throughput: str = "offline_tokens_per_s",
) -> Verdict:
    """``config``'s seeds judged against the targets; its offline tokens/s is the mean over seeds of
    the runs' ``throughput`` figure."""
    met = sum(not violated(run, targets, tolerance_share) for run in runs)
    mean = statistics.fmean(run.get(throughput, 0.0) for run in runs) if runs else 0.0
    return Verdict(config, met, len(runs), mean)


def over_baseline(mode: Verdict, baseline: Verdict) -> dict[str, Any]:
    """The mode's offline throughput over the baseline's, or why there is no ratio: the baseline
    missed the SLO (refused), or ran no offline work, or the mode missed the SLO (scored 0)."""
    if not baseline.met:
        return {
            "ratio": None,
            "why": f"baseline refused: it met the SLO on {baseline.seeds_met} of {baseline.seeds} seeds",
        }
    if not mode.met:
        return {"ratio": 0.0, "why": f"{mode.config} met the SLO on {mode.seeds_met} of {mode.seeds} seeds"}
    if baseline.offline_tokens_per_s <= 0:
        return {"ratio": None, "why": "the baseline ran no offline work at the SLO"}
    return {"ratio": round(mode.offline_tokens_per_s / baseline.offline_tokens_per_s, 2), "why": ""}
