"""Mix traces to a target compute density and prefix-sharing ratio (paper Appendix A.3).

A compute-heavy trace and the memory-heavy OpenVid trace set the density; MMLU requests, whose
few-shot prefixes are shared, set the sharing ratio. Counts are solved by nested bisection on the
per-trace means of the cost model, then the requests are drawn and shuffled with the seed, so the
same (density, sharing, n, seed) always gives the same workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.workloads.traces import GENERATORS, MMLU_SUBJECTS
from sgl_blend.core.cost_model import CostModel, subset_density
from sgl_blend.sim.workload import SimRequest

CALIBRATION_SAMPLES = 4000


@dataclass(frozen=True)
class TraceMeans:
    comp: float
    mem: float
    prompt: float
    prefix: float


def trace_means(name: str, cost: CostModel, seed: int = 0) -> TraceMeans:
    rng = random.Random(seed)
    sample = [GENERATORS[name](rng, index) for index in range(CALIBRATION_SAMPLES)]
    n = len(sample)
    return TraceMeans(
        sum(cost.comp_time(r.prompt_len, r.output_len) for r in sample) / n,
        sum(cost.mem_time(r.prompt_len, r.output_len) for r in sample) / n,
        sum(r.prompt_len for r in sample) / n,
        sum(r.prefix_len for r in sample) / n,
    )


def mix_properties(counts: dict[str, float], means: dict[str, TraceMeans]) -> tuple[float, float]:
    """(density, sharing) of a mix with these per-trace counts, from the trace means."""
    comp = sum(counts[name] * means[name].comp for name in counts)
    mem = sum(counts[name] * means[name].mem for name in counts)
    prompt = sum(counts[name] * means[name].prompt for name in counts)
    mmlu = counts.get("mmlu", 0.0)
    saved = max(mmlu - MMLU_SUBJECTS, 0.0) * means["mmlu"].prefix if "mmlu" in means else 0.0
    sharing = saved / prompt if prompt else 0.0
    return subset_density(comp, mem, sharing), sharing


def _bisect(function, low: float, high: float, target: float, increasing: bool) -> float:
    for _ in range(60):
        middle = (low + high) / 2
        if (function(middle) < target) == increasing:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def solve_counts(n: int, density: float, sharing: float, compute_trace: str, cost: CostModel) -> dict[str, int]:
    means = {name: trace_means(name, cost) for name in (compute_trace, "openvid", "mmlu")}

    def counts_for(mmlu_fraction: float) -> dict[str, float]:
        rest = n * (1 - mmlu_fraction)

        def density_at(video_fraction: float) -> float:
            mix = {compute_trace: rest * (1 - video_fraction), "openvid": rest * video_fraction, "mmlu": n * mmlu_fraction}
            return mix_properties(mix, means)[0]

        video = _bisect(density_at, 0.0, 1.0, density, increasing=False)
        return {compute_trace: rest * (1 - video), "openvid": rest * video, "mmlu": n * mmlu_fraction}

    mmlu_fraction = _bisect(lambda f: mix_properties(counts_for(f), means)[1], 0.0, 0.95, sharing, increasing=True)
    return {name: int(round(count)) for name, count in counts_for(mmlu_fraction).items()}


def mix(n: int, density: float, sharing: float, cost: CostModel, seed: int = 0,
        compute_trace: str = "burstgpt") -> list[SimRequest]:
    counts = solve_counts(n, density, sharing, compute_trace, cost)
    rng = random.Random(seed)
    requests = [GENERATORS[name](rng, index) for name, count in counts.items() for index in range(count)]
    rng.shuffle(requests)
    return requests


TABLE2_TRACES = {
    "trace1": (1.4, 0.35),
    "trace2": (0.9, 0.35),
    "trace3": (1.4, 0.05),
    "trace4": (0.9, 0.05),
}
