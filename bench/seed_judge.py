"""How the emulated co-location bench judges a load: absolute SLO targets from online-only, a
tolerance measured as online-only's own seed-to-seed spread, and a configuration that counts only
where it met the SLO on most evaluation seeds.

Why these rules. One online-only replay is a sample: another seed of the same arrival process
moves its P99 TTFT and TBT by a measurable amount. A tolerance smaller than that spread would fail
online-only itself on some seeds, and one typed in by hand could hide a real violation; so it is
the spread, computed. A baseline that missed the SLO bought its throughput with latency: comparing
a mode that met the SLO with it would flatter the baseline, so the judge refuses its throughput.
What the baseline reaches at the SLO is then what it reached at the floor of its search (one line
in flight) where that met the SLO, and 0 where even the floor missed it: priority scheduling
cannot run any offline work beside that load within the SLO. A mode that met the SLO beats that
0 by an unbounded ratio only with at least the offline throughput the floor bought by missing
it: a mode keeping the SLO by running next to nothing (a HyGen budget at the smallest iteration
decodes a few tokens a second) beats nothing. A baseline whose floor was not run is refused with
no ratio.
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


@dataclass(frozen=True)
class BaselineScore:
    """The baseline's offline tokens/s a mode is measured against at one load (None: refused with no
    score), why it is that, and, scored 0, the offline tokens/s its floor moved missing the SLO."""

    tokens_per_s: float | None
    why: str = ""
    missed_at_floor_tokens_per_s: float = 0.0


def baseline_score(searched: Verdict, floor: Verdict | None) -> BaselineScore:
    """The searched baseline where it met the SLO; else its run at the search's floor (``floor``:
    None where it did not run) where that met it; else 0 when the floor missed too, or no score."""
    if searched.met:
        return BaselineScore(searched.offline_tokens_per_s)
    missed = f"searched {searched.config} met the SLO on {searched.seeds_met} of {searched.seeds} seeds"
    if floor is None:
        return BaselineScore(None, f"baseline refused: {missed}; its floor did not run")
    if floor.met:
        return BaselineScore(floor.offline_tokens_per_s, f"{missed}; scored at its floor")
    return BaselineScore(
        0.0,
        f"baseline scored 0: {missed}, at its floor on {floor.seeds_met} of {floor.seeds} "
        f"(moving {floor.offline_tokens_per_s:.0f} offline tok/s)",
        floor.offline_tokens_per_s,
    )


def over_baseline(mode: Verdict, baseline: BaselineScore) -> dict[str, Any]:
    """The mode's offline throughput over the baseline's score, or why there is no ratio: the
    baseline was refused, the mode missed the SLO (scored 0), or the baseline's score is 0, which a
    mode that met the SLO beats by an unbounded ratio (``unbounded``) with at least the offline
    throughput the baseline's floor moved missing it."""
    if baseline.tokens_per_s is None:
        return {"ratio": None, "why": baseline.why}
    if not mode.met:
        return {"ratio": 0.0, "why": f"{mode.config} met the SLO on {mode.seeds_met} of {mode.seeds} seeds"}
    if baseline.tokens_per_s <= 0:
        enough = max(baseline.missed_at_floor_tokens_per_s, 0.0)
        unbounded = mode.offline_tokens_per_s > 0 and mode.offline_tokens_per_s >= enough
        return {"ratio": None, "unbounded": unbounded, "why": baseline.why}
    return {"ratio": round(mode.offline_tokens_per_s / baseline.tokens_per_s, 2), "why": baseline.why}
