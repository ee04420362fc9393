"""What a simulation measured, the workload's bound, and the summary the CLI and bench print.

Throughput counts every prompt and output token, as the paper does. ``T_o`` is the practical
optimum: the overlap function applied to the workload's total compute (less what maximal prefix
sharing saves) and total memory time, which no schedule can beat (see `overlap`); with ``max`` it
is the paper's ``max((1 - s) T_comp, T_mem)``, reported too as the ideal bound.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sgl_blend.core.cost_model import CostModel, optimal_time
from sgl_blend.forward_time.overlap import OverlapFunction
from sgl_blend.sim.workload import SimRequest


@dataclass
class StepTrace:
    """Per-iteration compute and memory time, the time the iteration took, and what it ran (its
    decoding requests and prefill tokens), so a job's time can be accounted iteration by
    iteration (`bench.job_accounting`); a closed-form decode stretch is one record with its step
    count and its totals, so 400K-request runs stay a few MB."""

    steps: array = field(default_factory=lambda: array("l"))
    comp: array = field(default_factory=lambda: array("d"))
    mem: array = field(default_factory=lambda: array("d"))
    seconds: array = field(default_factory=lambda: array("d"))
    decodes: array = field(default_factory=lambda: array("l"))
    prefill: array = field(default_factory=lambda: array("l"))

    def add(self, steps: int, comp: float, mem: float, seconds: float, decodes: int, prefill: int) -> None:
        """``decodes``: requests decoding in each of the ``steps``; ``prefill``: prompt tokens
        computed over all of them."""
        self.steps.append(steps)
        self.comp.append(comp)
        self.mem.append(mem)
        self.seconds.append(seconds)
        self.decodes.append(decodes)
        self.prefill.append(prefill)


@dataclass
class SimResult:
    policy: str
    seconds: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    comp_seconds: float
    mem_seconds: float
    iterations: int
    retractions: int
    peak_kv: int
    kv_capacity: int
    admitted_order: list[str]
    finished: dict[str, int]
    trace: StepTrace
    # The same schedule's time under every overlap the engine priced it with (the primary too),
    # by the overlap's name: the schedule never depends on time, so one run serves each lambda.
    seconds_under: dict[str, float] = field(default_factory=dict)

    def under(self, overlap_name: str) -> SimResult:
        """This run as priced under another overlap the engine was given (``also_price``)."""
        return replace(self, seconds=self.seconds_under[overlap_name])

    @property
    def tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds if self.seconds else 0.0

    @property
    def sharing_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class WorkloadBound:
    t_comp: float
    t_mem: float
    sharing: float
    t_o: float
    t_o_ideal: float

    @property
    def density(self) -> float:
        return (1 - self.sharing) * self.t_comp / self.t_mem if self.t_mem else float("inf")


def max_sharing_ratio(requests: Sequence[SimRequest]) -> float:
    """Prompt tokens a cache that never evicts would reuse (every shared segment computed once)."""
    uses: Counter[tuple[str, int]] = Counter(segment for request in requests for segment in request.prefix)
    saved = sum((count - 1) * length for (_key, length), count in uses.items())
    prompt = sum(request.prompt_len for request in requests)
    return saved / prompt if prompt else 0.0


def workload_bound(requests: Sequence[SimRequest], cost: CostModel, overlap: OverlapFunction) -> WorkloadBound:
    t_comp = sum(cost.comp_time(r.prompt_len, r.output_len) for r in requests)
    t_mem = sum(cost.mem_time(r.prompt_len, r.output_len) for r in requests)
    sharing = max_sharing_ratio(requests)
    return WorkloadBound(
        t_comp, t_mem, sharing, overlap((1 - sharing) * t_comp, t_mem), optimal_time(t_comp, t_mem, sharing)
    )


def summarise(result: SimResult, bound: WorkloadBound) -> dict[str, Any]:
    return {
        "seconds": round(result.seconds, 3),
        "tokens_per_s": round(result.tokens_per_s, 1),
        "fraction_of_t_o": round(bound.t_o / result.seconds, 4) if result.seconds else 0.0,
        "fraction_of_ideal_t_o": round(bound.t_o_ideal / result.seconds, 4) if result.seconds else 0.0,
        "sharing_ratio": round(result.sharing_ratio, 4),
        "compute_utilisation": round(result.comp_seconds / result.seconds, 4) if result.seconds else 0.0,
        "memory_utilisation": round(result.mem_seconds / result.seconds, 4) if result.seconds else 0.0,
        "iterations": result.iterations,
        "retractions": result.retractions,
        "peak_kv_fraction": round(result.peak_kv / result.kv_capacity, 4),
    }


def compare_to(results: dict[str, dict[str, Any]], sims: dict[str, SimResult], baseline: str) -> None:
    """Add each policy's speedup and sharing fraction relative to ``baseline`` (DFS)."""
    if baseline not in sims:
        return
    base = sims[baseline]
    for name, sim in sims.items():
        results[name][f"speedup_over_{baseline}"] = round(base.seconds / sim.seconds, 4)
        results[name][f"sharing_fraction_of_{baseline}"] = (
            round(sim.sharing_ratio / base.sharing_ratio, 4) if base.sharing_ratio else 1.0
        )
