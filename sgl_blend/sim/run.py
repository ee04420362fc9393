"""One simulation: a workload, a policy by name, a model on a device, an overlap function.

Every policy runs on the same engine and cost model; what differs is only the order the
policy asks for. The bound ``T_o = max((1 - s) T_comp, T_mem)`` uses the DFS sharing ratio of
the whole workload, the most any order can reuse.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from sgl_blend.core.cost_model import CostModel, HardwareSpec, ModelSpec, optimal_time
from sgl_blend.core.policies import POLICIES, make_policy
from sgl_blend.core.prefix_tree import PrefixTree
from sgl_blend.sim.engine import SimEngine, SimResult
from sgl_blend.sim.lpm_policy import SGLangLPMPolicy
from sgl_blend.sim.overlap import OverlapFunction
from sgl_blend.sim.workload import SimRequest

SIM_POLICIES = (*POLICIES, SGLangLPMPolicy.name)


def workload_bound(requests: Sequence[SimRequest], cost: CostModel) -> dict[str, float]:
    """``T_comp``, ``T_mem``, the maximal sharing ratio and ``T_o`` of a workload."""
    t_comp = sum(cost.comp_time(r.prompt_len, r.output_len) for r in requests)
    t_mem = sum(cost.mem_time(r.prompt_len, r.output_len) for r in requests)
    prompt = sum(r.prompt_len for r in requests)
    first_use: set[str] = set()
    saved = 0
    for request in requests:
        if request.prefix_key is not None:
            if request.prefix_key in first_use:
                saved += request.prefix_len
            first_use.add(request.prefix_key)
    sharing = saved / prompt if prompt else 0.0
    return {"t_comp": t_comp, "t_mem": t_mem, "sharing": sharing, "t_o": optimal_time(t_comp, t_mem, sharing),
            "density": (1 - sharing) * t_comp / t_mem if t_mem else float("inf")}


def simulate(requests: Sequence[SimRequest], policy_name: str, model: ModelSpec, hardware: HardwareSpec,
             overlap: OverlapFunction, *, seed: int = 0, progress: Callable[[int], None] | None = None,
             **engine_options: Any) -> SimResult:
    cost = CostModel(model, hardware)
    if policy_name == SGLangLPMPolicy.name:
        policy = SGLangLPMPolicy(cost, seed=seed)
    else:
        policy = make_policy(policy_name, model, hardware, seed=seed)
    return SimEngine(cost, policy, overlap, **engine_options).run(requests, progress)


def summarise(result: SimResult, bound: dict[str, float]) -> dict[str, Any]:
    return {
        "seconds": round(result.seconds, 3),
        "tokens_per_s": round(result.tokens_per_s, 1),
        "fraction_of_t_o": round(bound["t_o"] / result.seconds, 4) if result.seconds else 0.0,
        "sharing_ratio": round(result.sharing_ratio, 4),
        "compute_utilisation": round(result.comp_seconds / result.seconds, 4) if result.seconds else 0.0,
        "memory_utilisation": round(result.mem_seconds / result.seconds, 4) if result.seconds else 0.0,
        "iterations": result.iterations,
        "retractions": result.retractions,
    }


def prefix_tree_of(requests: Sequence[SimRequest]) -> PrefixTree:
    tree = PrefixTree()
    for index, request in enumerate(requests):
        tree.insert(index, request.prompt_ids, 0.0, 0.0)
    return tree
