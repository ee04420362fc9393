"""A job's price before it runs: the simulator's run of its lines on a stock engine of the device.

For each order the job could run in, the simulator runs the shipped path (the runner's plan and
window, the scheduler's policy, SGLang's chunked mixed batches and limits: `run.simulate`,
`sizing.stock_engine`) and reports the predicted job time -- the device time of its forwards; the
planning and HTTP time of a real run are not in it -- with its throughput, its fraction of the
workload's ``T_o`` bound and the prompt tokens its order finds in the prefix cache. The bound is
the paper's: ``T_o = f((1 - s) T_comp, T_mem)`` with ``s`` the most sharing any order can get, under
the device's overlap ``f`` (``t_o``), and with perfect overlap, ``max`` (``t_o_ideal``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sgl_blend.core.cost_model import CostModel
from sgl_blend.forward_time.overlap import hardware_overlap
from sgl_blend.sim.metrics import SimResult, workload_bound
from sgl_blend.sim.run import simulate
from sgl_blend.sim.sizing import StockEngine
from sgl_blend.sim.workload import SimRequest


def estimate(
    requests: Sequence[SimRequest],
    engine: StockEngine,
    policies: Sequence[str],
    *,
    window: int | None = None,
    seed: int = 0,
    on_finish: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """The report for ``requests`` (in file order) under each of ``policies`` (simulator names)."""
    cost = CostModel(engine.model, engine.hardware)
    overlap = hardware_overlap(engine.hardware)
    bound = workload_bound(requests, cost, overlap)
    prompt = sum(request.prompt_len for request in requests)
    output = sum(request.output_len for request in requests)
    report: dict[str, Any] = {
        "requests": len(requests),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "model": engine.model.name,
        "hardware": engine.hardware.name,
        "overlap": overlap.name,
        "engine": {
            "kv_tokens": engine.config.kv_capacity,
            "chunked_prefill_size": engine.config.token_budget,
            "max_running_requests": engine.config.max_running,
        },
        "bound": {
            "t_o_seconds": bound.t_o,
            "t_o_ideal_seconds": bound.t_o_ideal,
            "t_comp_seconds": bound.t_comp,
            "t_mem_seconds": bound.t_mem,
            "max_sharing": bound.sharing,
            "max_saved_prompt_tokens": round(bound.sharing * prompt),
        },
        "policies": {},
    }
    for name in policies:
        result = simulate(
            requests,
            name,
            engine.model,
            engine.hardware,
            overlap,
            seed=seed,
            config=engine.config,
            window=window,
            on_finish=on_finish,
        )
        report["policies"][name] = policy_entry(result, bound.t_o)
    return report


def policy_entry(result: SimResult, t_o: float) -> dict[str, Any]:
    return {
        "seconds": result.seconds,
        "tokens_per_s": result.tokens_per_s,
        "fraction_of_t_o": t_o / result.seconds if result.seconds else 0.0,
        "saved_prompt_tokens": result.cached_tokens,
        "cache_hit_ratio": result.sharing_ratio,
        "iterations": result.iterations,
        "retractions": result.retractions,
    }


def table(report: dict[str, Any]) -> str:
    """The report as the readable table ``sgl-blend estimate`` prints."""
    bound = report["bound"]
    lines = [
        f"{report['requests']} lines, {report['prompt_tokens']:,} prompt + "
        f"{report['output_tokens']:,} output tokens;"
        f" {report['model']} on {report['hardware']} ({report['overlap']}), "
        f"{report['engine']['kv_tokens']:,} KV tokens, chunk {report['engine']['chunked_prefill_size']}, "
        f"{report['engine']['max_running_requests']} running",
        f"T_o bound {bound['t_o_seconds']:.1f} s (perfect overlap {bound['t_o_ideal_seconds']:.1f} s; "
        f"T_comp {bound['t_comp_seconds']:.1f} s, T_mem {bound['t_mem_seconds']:.1f} s, "
        f"at most {bound['max_saved_prompt_tokens']:,} prompt tokens saved by sharing, "
        f"{bound['max_sharing']:.1%})",
        "",
        f"{'policy':<12} {'predicted s':>12} {'tokens/s':>12} {'of T_o':>7} "
        f"{'saved prompt tokens':>20} {'hit ratio':>9}",
    ]
    policies = report["policies"]
    for name, entry in policies.items():
        lines.append(
            f"{name:<12} {entry['seconds']:>12.1f} {entry['tokens_per_s']:>12,.0f} "
            f"{entry['fraction_of_t_o']:>7.3f}"
            f" {entry['saved_prompt_tokens']:>20,} {entry['cache_hit_ratio']:>9.3f}"
        )
    first, *others = policies
    if others:
        lines.append("")
        lines.append(
            f"{first}: "
            + ", ".join(f"{policies[other]['seconds'] / policies[first]['seconds']:.2f}x {other}" for other in others)
        )
    return "\n".join(lines)
