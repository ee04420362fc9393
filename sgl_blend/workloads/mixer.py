"""Mix traces to a target compute density and prefix-sharing ratio (paper Appendix A.3).

A compute-heavy trace (BurstGPT by default; Azure, LIMO or real ShareGPT too) and the memory-heavy
OpenVid set the density; MMLU, whose few-shot prefixes are shared, sets the sharing ratio. Each
trace is a seeded stream and a mix takes the first ``c``, ``v`` and ``m`` requests of the three
streams, so the mix's exact totals are prefix sums and the counts are found by nested integer
bisection on the real requests (not on trace means, which OpenVid's heavy output tail makes
unreliable at small ``n``): outer on the MMLU count for sharing, inner on the OpenVid count for
density. The result is shuffled with the seed into its submission order, so (n, density, sharing,
seed) always gives the same workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from sgl_blend.core.cost_model import CostModel
from sgl_blend.sim.workload import SimRequest
from sgl_blend.workloads.synthetic import generate

TABLE2_TRACES: dict[str, tuple[float, float]] = {
    "trace1": (1.4, 0.35),
    "trace2": (0.9, 0.35),
    "trace3": (1.4, 0.05),
    "trace4": (0.9, 0.05),
}
GRID_DENSITIES = tuple(round(0.80 + 0.05 * step, 2) for step in range(13))
GRID_SHARINGS = tuple(round(0.05 + 0.10 * step, 2) for step in range(5))


@dataclass(frozen=True)
class _Stream:
    """A trace's requests with prefix sums of compute, memory, prompt and shared tokens."""

    requests: list[SimRequest]
    comp: np.ndarray
    mem: np.ndarray
    prompt: np.ndarray
    saved: np.ndarray

    @classmethod
    def of(cls, requests: list[SimRequest], cost: CostModel) -> _Stream:
        seen: set[str] = set()
        saved = []
        for request in requests:
            saved.append(sum(length for key, length in request.prefix if key in seen))
            seen.update(key for key, _length in request.prefix)

        def prefix_sum(values) -> np.ndarray:
            return np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])

        return cls(
            requests,
            prefix_sum([cost.comp_time(r.prompt_len, r.output_len) for r in requests]),
            prefix_sum([cost.mem_time(r.prompt_len, r.output_len) for r in requests]),
            prefix_sum([r.prompt_len for r in requests]),
            prefix_sum(saved),
        )


def _generate(trace: str, n: int, seed: int, long_output_scale: float = 1.0) -> list[SimRequest]:
    if trace == "sharegpt":
        from sgl_blend.workloads import sharegpt

        return sharegpt.load(n, seed)
    return generate(trace, n, seed, long_output_scale)


def _properties(streams: tuple[_Stream, _Stream, _Stream], counts: tuple[int, int, int]) -> tuple[float, float]:
    """(density, sharing) of the mix taking ``counts`` from each stream."""
    comp = sum(stream.comp[count] for stream, count in zip(streams, counts))
    mem = sum(stream.mem[count] for stream, count in zip(streams, counts))
    prompt = sum(stream.prompt[count] for stream, count in zip(streams, counts))
    saved = sum(stream.saved[count] for stream, count in zip(streams, counts))
    sharing = saved / prompt if prompt else 0.0
    return ((1 - sharing) * comp / mem if mem else float("inf")), sharing


def _bisect(low: int, high: int, too_low) -> int:
    """Smallest integer in [low, high] where ``too_low`` turns false (monotone predicate)."""
    while low < high:
        middle = (low + high) // 2
        if too_low(middle):
            low = middle + 1
        else:
            high = middle
    return low


def solve_counts(
    n: int, density: float, sharing: float, streams: tuple[_Stream, _Stream, _Stream]
) -> tuple[int, int, int]:
    def with_mmlu(m: int) -> tuple[int, int, int]:
        v = _bisect(0, n - m, lambda v: _properties(streams, (n - m - v, v, m))[0] > density)
        if v > 0:
            above = _properties(streams, (n - m - v + 1, v - 1, m))[0]
            below = _properties(streams, (n - m - v, v, m))[0]
            v -= int(above - density < density - below)
        return n - m - v, v, m

    m = _bisect(0, n, lambda m: _properties(streams, with_mmlu(m))[1] < sharing)
    return with_mmlu(m)


def mix(
    n: int,
    density: float,
    sharing: float,
    cost: CostModel,
    seed: int = 0,
    compute_trace: str = "burstgpt",
    long_output_scale: float = 1.0,
) -> list[SimRequest]:
    def stream(trace: str) -> _Stream:
        return _Stream.of(_generate(trace, n, seed, long_output_scale), cost)

    streams = (stream(compute_trace), stream("openvid"), stream("mmlu"))
    counts = solve_counts(n, density, sharing, streams)
    requests = [request for stream, count in zip(streams, counts) for request in stream.requests[:count]]
    random.Random(seed).shuffle(requests)
    return requests


def named_workload(
    name: str, n: int, cost: CostModel, seed: int = 0, long_output_scale: float = 1.0
) -> list[SimRequest]:
    """``trace1``..``trace4`` (Table 2) or ``DENSITY:SHARING`` (e.g. ``1.2:0.25``)."""
    density, sharing = TABLE2_TRACES[name] if name in TABLE2_TRACES else (float(part) for part in name.split(":"))
    return mix(n, density, sharing, cost, seed, long_output_scale=long_output_scale)
