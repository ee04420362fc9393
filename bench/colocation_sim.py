"""Co-location in the simulator: the core HyGen planner against online-only, SGLang priority and HyGen*.

Online load: ShareGPT prompt and reply lengths at Poisson arrivals, and bursty arrivals swinging
3x every half period, at several mean rates. Offline load: a Table-2 trace (``trace1`` by
default), enough that no configuration runs out before the online trace ends. The engine is
`sgl_blend.sim.colocation` on Llama-3.1-8B / H100 with iteration times from `StepTime`, and every
configuration runs the same `ColocationController` (core) the SGLang plugin runs:

- online-only: no offline work; the SLO reference (P99 TBT within 5% by default, HyGen's load sweep);
- sglang-priority: online first, offline fills every iteration, SGLang's own offline order (LPM)
  and batches (no ``--enable-mixed-chunk``: a prefill iteration carries no decodes) -- SGLang's
  ``--enable-priority-scheduling`` as the CPU benchmark launches it;
- hygen-star: online first, mixed chunks, offline requests released at a fixed rate -- the largest
  rate meeting the SLOs, found by the core SLO search (`slo_search.search_budget`);
- hygen: the latency budget found by the same search, offline work in PSM order.

Both searches replay a tuning trace (another seed of the same arrival process and load); the
table reports a fresh evaluation trace, whose own online-only run is its SLO reference. The
latency model is fitted (`core.latency_model.fit_forms`) on randomly composed batches timed by the
simulated engine, as `sgl-blend profile --latency` fits the real one.

    python -m bench.colocation_sim            # writes bench/results/colocation_sim.{json,md,png}
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from bench.colocation_plot import CONFIG_COLORS, label_column, latency_figure, plot_online, save_figure
from sgl_blend.workloads import sharegpt
from sgl_blend.workloads.arrivals import PATTERNS, arrival_times
from sgl_blend.workloads.mixer import named_workload
from sgl_blend.core.colocation import ColocationConfig, ColocationController
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.core.slo_search import SLO, search_budget, violations
from sgl_blend.measure.online_replay import summarize
from sgl_blend.sim.colocation import ColocatedConfig, ColocatedEngine, ColocatedResult, OnlineArrival
from sgl_blend.sim.lpm_policy import SGLangLPMPolicy
from sgl_blend.sim.overlap import overlap_function
from sgl_blend.sim.step_time import NoisyClock, StepTime, fit_latency
from sgl_blend.sim.workload import SimRequest

RESULTS = Path(__file__).parent / "results"
CONFIGS = ("online-only", "hygen", "hygen-star", "sglang-priority")
SERIES_BIN_S = 5.0
TUNE_SEED, EVAL_SEED = 1, 2


@dataclass
class Setup:
    args: argparse.Namespace
    cost: CostModel
    step: StepTime
    latency_model: dict[str, Any]
    online_pool: list[SimRequest]
    offline: list[SimRequest]


_SETUP: Setup | None = None


def online_arrivals(setup: Setup, pattern: str, rate: float, seed: int) -> list[OnlineArrival]:
    """Arrivals of ``pattern`` with ShareGPT requests drawn (seeded) from the pool."""
    args = setup.args
    times = arrival_times(pattern, rate, args.duration, args.period, seed)
    rng = random.Random(seed)
    return [OnlineArrival(at, rng.choice(setup.online_pool)) for at in times]


def simulate(setup: Setup, arrivals: Sequence[OnlineArrival], config: str, value: float | None = None,
             seed: int = 0) -> ColocatedResult:
    """One configuration; ``value`` is hygen's budget (s) or hygen-star's offline rate (req/s)."""
    args = setup.args
    model, hardware = setup.cost.model, setup.cost.hardware
    budget = value if config == "hygen" else None
    controller = ColocationController(ColocationConfig(mode="hygen", latency_budget_s=budget,
                                                       latency_model=setup.latency_model))
    offline: list[SimRequest] = [] if config == "online-only" else setup.offline
    if config == "sglang-priority":
        policy = SGLangLPMPolicy(setup.cost, seed=seed)
    elif config == "hygen-star":
        policy = make_offline_policy("fcfs", model, hardware, seed=seed)
    else:
        policy = make_offline_policy(args.offline_policy, model, hardware, seed=seed)
    engine_config = ColocatedConfig(setup.cost.kv_capacity_tokens(), chunk_tokens=args.chunk,
                                    max_running=args.max_running,
                                    offline_rate=value if config == "hygen-star" else None,
                                    mixed=config != "sglang-priority")
    engine = ColocatedEngine(NoisyClock(setup.step, args.jitter, seed), controller, policy if offline else None,
                             engine_config)
    return engine.run(arrivals, offline, args.duration)


def measured(result: ColocatedResult, series: bool = False) -> dict[str, Any]:
    summary = {**summarize(result.online), "offline_tokens_per_s": result.offline_tokens_per_s(),
               "iterations": result.iterations, "counts": result.counts}
    if series:
        bins: dict[int, int] = {}
        for at, tokens in result.offline_events:
            if at <= result.horizon_s:
                bins[int(at // SERIES_BIN_S)] = bins.get(int(at // SERIES_BIN_S), 0) + tokens
        summary["series"] = {
            "online": [{"t": round(timing.sent_at, 3), "ttft": timing.ttft,
                        "tbt": (sum(timing.gaps) / len(timing.gaps)) if timing.gaps else None}
                       for timing in result.online],
            "offline_tok_s": [(k * SERIES_BIN_S, tokens / SERIES_BIN_S) for k, tokens in sorted(bins.items())],
        }
    return summary


def searched(setup: Setup, arrivals: Sequence[OnlineArrival], config: str, slos: list[SLO], low: float,
             high: float) -> tuple[float, list[dict[str, Any]]]:
    """The core SLO search over hygen's budget or hygen-star's rate, on the tuning trace."""
    trials: list[dict[str, Any]] = []

    def evaluate(value: float) -> dict[str, Any]:
        result = measured(simulate(setup, arrivals, config, value, seed=TUNE_SEED))
        trials.append({"value": value, **result})
        return result

    outcome = search_budget(evaluate, slos, setup.args.tolerance, low, high, setup.args.steps)
    return (outcome.budget_s if outcome.budget_s is not None else low), trials


def cell(task: tuple[str, float]) -> dict[str, Any]:
    """Every configuration at one arrival pattern and mean online rate."""
    pattern, rate = task
    setup, args = _SETUP, _SETUP.args
    started = time.monotonic()
    tune = online_arrivals(setup, pattern, rate, seed=TUNE_SEED)
    evaluation = online_arrivals(setup, pattern, rate, seed=EVAL_SEED)
    tune_reference = measured(simulate(setup, tune, "online-only", seed=TUNE_SEED))
    tune_slos = [SLO(metric, tune_reference[metric]) for metric in args.slo]
    budget, budget_trials = searched(setup, tune, "hygen", tune_slos, args.low_budget_ms / 1000,
                                     args.high_budget_ms / 1000)
    offline_rate, rate_trials = searched(setup, tune, "hygen-star", tune_slos, args.low_rate, args.high_rate)
    runs = {
        "online-only": measured(simulate(setup, evaluation, "online-only", seed=EVAL_SEED), series=True),
        "hygen": measured(simulate(setup, evaluation, "hygen", budget, seed=EVAL_SEED), series=True),
        "hygen-star": measured(simulate(setup, evaluation, "hygen-star", offline_rate, seed=EVAL_SEED), series=True),
        "sglang-priority": measured(simulate(setup, evaluation, "sglang-priority", seed=EVAL_SEED), series=True),
    }
    slos = [SLO(metric, runs["online-only"][metric]) for metric in args.slo]
    for run in runs.values():
        run["slos_violated"] = violations(run, slos, args.tolerance)
    return {"pattern": pattern, "rate_per_s": rate, "online_requests": len(evaluation), "budget_s": budget,
            "offline_rate_per_s": offline_rate, "tune_reference": tune_reference,
            "search": {"hygen": budget_trials, "hygen-star": rate_trials}, "runs": runs,
            "wall_s": round(time.monotonic() - started, 1)}


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 2) if denominator > 0 else None


def table(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for result in cells:
        ours = result["runs"]["hygen"]["offline_tokens_per_s"]
        for config in CONFIGS:
            run = result["runs"][config]
            rows.append({
                "pattern": result["pattern"], "rate_per_s": result["rate_per_s"], "config": config,
                **{metric: round(run[metric] * 1000, 2) for metric in ("ttft_mean", "ttft_p99", "tbt_mean", "tbt_p99")},
                "offline_tok_s": round(run["offline_tokens_per_s"]),
                "slos_met": not run["slos_violated"],
                "hygen_over_this": _ratio(ours, run["offline_tokens_per_s"]) if config != "hygen" else None,
            })
    return rows


def targets(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's simulator targets, each with the figures it rests on."""
    lowest = min(result["rate_per_s"] for result in cells)
    over_star = {f"{c['pattern']}@{c['rate_per_s']}": _ratio(c["runs"]["hygen"]["offline_tokens_per_s"],
                                                             c["runs"]["hygen-star"]["offline_tokens_per_s"])
                 for c in cells}
    over_priority = {f"{c['pattern']}@{c['rate_per_s']}": _ratio(c["runs"]["hygen"]["offline_tokens_per_s"],
                                                                 c["runs"]["sglang-priority"]["offline_tokens_per_s"])
                     for c in cells if c["rate_per_s"] == lowest}
    slos = {f"{c['pattern']}@{c['rate_per_s']}": not c["runs"]["hygen"]["slos_violated"] for c in cells}
    return {
        "hygen_slos_met_everywhere": all(slos.values()), "hygen_slos_met": slos,
        "hygen_over_hygen_star": over_star,
        "hygen_over_hygen_star_at_least_2x": all(r is None or r >= 2.0 for r in over_star.values()),
        "hygen_over_priority_at_lowest_load": over_priority,
        "hygen_over_priority_at_least_1.3x": all(r is not None and r >= 1.3 for r in over_priority.values()),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = ["| arrivals | online req/s | config | TTFT mean / P99 (ms) | TBT mean / P99 (ms) | offline tok/s | "
             "SLOs met | hygen / this |", "|---|---|---|---|---|---|---|---|"]
    for row in report["table"]:
        ratio = "" if row["hygen_over_this"] is None else f"{row['hygen_over_this']}x"
        lines.append(f"| {row['pattern']} | {row['rate_per_s']:g} | {row['config']} | {row['ttft_mean']} / "
                     f"{row['ttft_p99']} | {row['tbt_mean']} / {row['tbt_p99']} | {row['offline_tok_s']} | "
                     f"{'yes' if row['slos_met'] else 'no'} | {ratio} |")
    lines.append("")
    lines.append(f"SLOs: {', '.join(report['slo_metrics'])} within {report['tolerance']:.0%} of online-only on the "
                 f"same evaluation trace. Searched on a separate tuning trace: "
                 + "; ".join(f"{c['pattern']}@{c['rate_per_s']:g}: budget {c['budget_s'] * 1000:.2f} ms, "
                             f"HyGen* rate {c['offline_rate_per_s']:.3g} req/s" for c in report["cells"]) + ".")
    lines.append(f"Latency model ({report['latency_fit']['best']}) held-out MAPE: "
                 + ", ".join(f"{form} {fit['holdout_mape']:.1%}" for form, fit in report["latency_fit"]["forms"].items())
                 + ".")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    shown = [c for c in report["cells"] if c["rate_per_s"] == report["plot_rate"]]
    fig, axes = latency_figure(len(shown))
    for column, result in enumerate(shown):
        for config in CONFIGS:
            series = result["runs"][config]["series"]
            plot_online(axes, column, config, series["online"], marker_size=2)
            if series["offline_tok_s"]:
                at, rate = zip(*series["offline_tok_s"], (report["duration_s"], series["offline_tok_s"][-1][1]))
                axes[2, column].step(at, rate, where="post", color=CONFIG_COLORS[config])
        label_column(axes, column, f"{result['pattern']} arrivals, {result['rate_per_s']:g} req/s online",
                     "offline tok/s", "simulated seconds")
    save_figure(fig, axes, f"Simulated co-location, {report['model']} on {report['hardware']}: online latency and "
                "offline throughput over time", path)


def build_setup(args: argparse.Namespace) -> tuple[Setup, dict[str, Any]]:
    cost = CostModel(model_spec(args.model), HardwareSpec.resolve(args.hardware))
    step = StepTime.of(cost, overlap_function(args.overlap))
    fit = fit_latency(NoisyClock(step, args.jitter, seed=args.seed + 100), args.profile_batches, args.seed)
    latency_model = fit.models[fit.best_form()].to_dict()
    online_pool = sharegpt.load(args.online_pool, args.seed)
    offline = named_workload(args.offline_trace, args.offline_n, cost, args.seed)
    return Setup(args, cost, step, latency_model, online_pool, offline), fit.to_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--overlap", default="sum", help="how compute and memory time combine in one iteration")
    parser.add_argument("--jitter", type=float, default=0.02, help="log-normal sigma of measured iteration times")
    parser.add_argument("--profile-batches", type=int, default=400, help="timed batches the latency model is fitted on")
    parser.add_argument("--rates", default="2,8,16", help="mean online arrivals per second, comma-separated")
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of online arrivals per run")
    parser.add_argument("--period", type=float, default=15.0, help="bursty: seconds per high+low cycle")
    parser.add_argument("--offline-trace", default="trace1", help="trace1..trace4 (Table 2) or DENSITY:SHARING")
    parser.add_argument("--offline-n", type=int, default=5000)
    parser.add_argument("--offline-policy", default="psm", help="hygen's offline order")
    parser.add_argument("--online-pool", type=int, default=2000, help="ShareGPT conversations online requests come from")
    parser.add_argument("--chunk", type=int, default=512, help="tokens per iteration (chunked prefill size)")
    parser.add_argument("--max-running", type=int, default=256)
    parser.add_argument("--slo", default="tbt_p99",
                        help="SLO metrics, comma-separated (default: HyGen's load sweep, P99 TBT)")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=3, help="bisection steps per search after both ends")
    parser.add_argument("--low-budget-ms", type=float, default=5.0)
    parser.add_argument("--high-budget-ms", type=float, default=40.0)
    parser.add_argument("--low-rate", type=float, default=0.02, help="HyGen* offline requests per second, lowest")
    parser.add_argument("--high-rate", type=float, default=40.0)
    parser.add_argument("--workers", type=int, default=2, help="processes running (pattern, rate) cells")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "colocation_sim.json")
    args = parser.parse_args()
    args.slo = [metric.strip() for metric in args.slo.split(",") if metric.strip()]
    rates = [float(rate) for rate in args.rates.split(",")]
    patterns = [pattern.strip() for pattern in args.patterns.split(",")]
    started = time.monotonic()
    global _SETUP
    _SETUP, fit = build_setup(args)
    tasks = [(pattern, rate) for pattern in patterns for rate in rates]
    if args.workers > 1:
        with multiprocessing.get_context("fork").Pool(min(args.workers, len(tasks))) as pool:
            cells = pool.map(cell, tasks, chunksize=1)
    else:
        cells = [cell(task) for task in tasks]
    report = {"model": args.model, "hardware": args.hardware, "overlap": args.overlap, "jitter": args.jitter,
              "duration_s": args.duration, "period_s": args.period, "offline_trace": args.offline_trace,
              "offline_n": args.offline_n, "chunk": args.chunk, "slo_metrics": args.slo, "tolerance": args.tolerance,
              "latency_fit": fit, "plot_rate": sorted(rates)[len(rates) // 2], "cells": cells}
    for result in cells:
        if result["rate_per_s"] != report["plot_rate"]:
            for run in result["runs"].values():
                run.pop("series")
    report["table"] = table(cells)
    report["targets"] = targets(cells)
    report["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report) + "\n")
    plot(report, args.out.with_suffix(".png"))
    print(markdown(report))
    print(json.dumps(report["targets"], indent=1))


if __name__ == "__main__":
    main()
