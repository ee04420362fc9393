"""Co-location in the simulator, judged at equal SLO: HyGen, Echo and BROS against SGLang's priority
scheduling with its offline rate searched, at three online loads named by engine utilisation.

Online load: ShareGPT prompt and reply lengths at Poisson arrivals (and, with ``--patterns``,
bursty arrivals swinging 3x every half period). Offline load: a Table-2 trace (``trace1`` by
default), more than any configuration can finish before the online trace ends (the JSON says if
a pool ran dry). The engine is Llama-3.1-8B / H100 with iteration times from `StepTime`.

Loads: each online rate is chosen (`bench.load_picker`) so that online-only serving of the
evaluation trace keeps the engine busy for a target share of the wall time (default 25%, 40%,
55%: inside the issue's 20-60%); the utilisation measured on every run is in the output.

Configurations, all on the same arrivals, offline pool, chunk size (``--chunk``), running-request
cap and KV capacity:

- online-only: no offline work; the SLO reference (P99 TTFT and P99 TBT within 5%).
- hygen: `ColocationController` in HyGen mode, PSM offline order, its budget by online state
  (`core.state_budget`): the predicted online-only iteration plus a headroom, capped by the SLO
  targets (the tuning trace's online-only P99 TBT and TTFT plus the tolerance); the headroom,
  not an absolute budget, is searched.
- echo: the same controller in Echo mode (its deadlines and plan selector); its SLO settings are
  ``k`` times the tuning trace's online-only P99 TTFT (TTFT deadline) and P99 TBT (TPOT deadline
  and idle-iteration cap), with ``k`` searched.
- bros: `sim.bros_colocation` -- BROS's scheduler and bidirectional KV on the same clock, online
  as RT, offline as BE; its RT SLOs and idle-iteration cap are ``k`` times the same references,
  ``k`` searched.
- hygen-star: online first, mixed chunks, offline released at a fixed rate, rate searched.
- sglang-priority-searched: SGLang's priority scheduling -- online first, no mixed chunks (an
  iteration that prefills decodes nothing), SGLang's LPM offline order -- with its offline
  release rate searched. This is the baseline the goal is judged against.
- sglang-priority-unbounded and sglang-priority-online-only: the same engine with the whole pool
  released at once, and with no offline work (reference rows only).

Every search is the core SLO search (`core.slo_search.search_budget`, log bisection) on a tuning
trace (another seed of the same arrival process and rate) against that trace's own online-only
run; the table is a fresh evaluation trace judged against its own online-only run. The latency
model is fitted (`core.latency_model.fit_forms`) on random batches timed by the simulated engine,
as `sgl-blend profile --latency` fits the real one; BROS's scheduler gets that fit's ``bros`` form
and a swap model fitted on copies timed on the lab's H100.

    python -m bench.colocation_sim            # writes bench/results/colocation_sim.{json,md,png}
    python -m bench.colocation_sim --quick    # a smoke run (a minute), same outputs
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import tempfile
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from bench.colocation_judge import (
    BASELINE, CONFIGS, HEADROOM_KNOB, KNOB_NAMES, REFERENCES, SEARCHED, add_deadline_scale_arguments, markdown_goal, markdown_results,
    table, targets,
)
from bench.colocation_plot import CONFIG_COLORS, label_column, latency_figure, plot_online, save_figure
from bench.load_picker import pick_rate
from sgl_blend.core.bros.cost import IterationCost, SwapModel
from sgl_blend.core.bros.requests import SLO as RealtimeSLO
from sgl_blend.core.colocation import ColocationConfig, ColocationController
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.latency_model import BatchShape, LatencyModel
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.core.slo_search import METRICS, SLO, search_budget, steps_for, violations
from sgl_blend.measure.online_replay import summarize
from sgl_blend.sim.bros_colocation import ClockDevice, run_bros
from sgl_blend.sim.bros_device import H100_H2D_SAMPLES
from sgl_blend.sim.bros_engine import SimSettings
from sgl_blend.sim.colocation import ColocatedConfig, ColocatedEngine, ColocatedResult, OnlineArrival
from sgl_blend.sim.lpm_policy import SGLangLPMPolicy
from sgl_blend.forward_time.overlap import overlap_function
from sgl_blend.forward_time.step_time import NoisyClock, StepTime, fit_latency
from sgl_blend.sim.workload import SimRequest
from sgl_blend.workloads import sharegpt
from sgl_blend.workloads.arrivals import arrival_times
from sgl_blend.workloads.mixer import named_workload

RESULTS = Path(__file__).parent / "results"
SERIES_BIN_S = 5.0
TUNE_SEED, EVAL_SEED = 1, 2


class MeteredClock(NoisyClock):
    """A `NoisyClock` that adds up what it measures: the engine's busy time."""

    def __init__(self, step: StepTime, jitter: float, seed: int) -> None:
        super().__init__(step, jitter, seed)
        self.busy_s = 0.0

    def measure(self, shape: BatchShape) -> float:
        seconds = super().measure(shape)
        self.busy_s += seconds
        return seconds


@dataclass
class Setup:
    args: argparse.Namespace
    cost: CostModel
    step: StepTime
    latency_model: dict[str, Any]
    bros_model: LatencyModel
    swap: SwapModel
    online_pool: list[SimRequest]
    offline: list[SimRequest]


@dataclass
class Run:
    result: ColocatedResult
    busy_s: float


_SETUP: Setup | None = None


def online_arrivals(setup: Setup, pattern: str, rate: float, seed: int) -> list[OnlineArrival]:
    """Arrivals of ``pattern`` with ShareGPT requests drawn (seeded) from the pool. For a seed the
    draws are the same at every rate and the times scale with 1/rate (Poisson), so utilisation
    grows with the rate and the load picker can bisect it."""
    args = setup.args
    times = arrival_times(pattern, rate, args.duration, args.period, seed)
    rng = random.Random(seed)
    return [OnlineArrival(at, rng.choice(setup.online_pool)) for at in times]


def slo_settings(config: str, value: float, reference: dict[str, Any]) -> dict[str, float]:
    """Echo's and BROS's SLO settings in seconds: ``value`` (k) times the online-only P99s; both
    cap an iteration no online deadline bounds at the TPOT deadline (the same knob for both)."""
    ttft, tbt = value * reference["ttft_p99"], value * reference["tbt_p99"]
    if config == "echo":
        return {"ttft_slo_s": ttft, "tpot_slo_s": tbt, "idle_budget_s": tbt}
    return {"ttft_s": ttft, "tpot_s": tbt, "idle_s": tbt}


def hygen_settings(headroom_s: float, reference: dict[str, Any], tolerance: float) -> dict[str, float]:
    """HyGen's budget by state: ``headroom_s`` over the predicted online-only iteration, capped by
    the SLO targets ``reference``'s P99s allow (the TBT target while online requests decode, a
    waiting request's TTFT slack); with no online request present, the headroom itself."""
    return {"headroom_s": headroom_s, "tpot_slo_s": reference["tbt_p99"] * (1 + tolerance),
            "ttft_slo_s": reference["ttft_p99"] * (1 + tolerance)}


def simulate(setup: Setup, arrivals: Sequence[OnlineArrival], config: str, value: float | None = None,
             seed: int = 0, reference: dict[str, Any] | None = None) -> Run:
    """One configuration; ``value`` is the searched knob (`KNOB_NAMES`); ``reference`` the
    online-only run Echo's and BROS's SLO settings and HyGen's targets come from."""
    args = setup.args
    if config == "bros":
        device = ClockDevice(NoisyClock(setup.step, args.jitter, seed), setup.swap)
        settings = SimSettings(kv_tokens=setup.cost.kv_capacity_tokens(), max_running=args.max_running,
                               prefill_token_budget=args.chunk, be_concurrency=args.max_running,
                               slo=RealtimeSLO(**slo_settings(config, value, reference)), seed=seed)
        result = run_bros(arrivals, setup.offline, device, IterationCost(setup.bros_model, setup.swap), settings,
                          args.duration)
        return Run(result, device.busy_s)
    model, hardware = setup.cost.model, setup.cost.hardware
    if config == "echo":
        colocation = ColocationConfig(mode="echo", latency_model=setup.latency_model,
                                      **slo_settings(config, value, reference))
    else:
        colocation = ColocationConfig(mode="hygen", latency_model=setup.latency_model,
                                      **(hygen_settings(value, reference, args.tolerance) if config == "hygen" else {}))
    offline: list[SimRequest] = [] if config.endswith("online-only") else setup.offline
    if config.startswith("sglang-priority"):
        policy = SGLangLPMPolicy(setup.cost, seed=seed)
    elif config == "hygen-star":
        policy = make_offline_policy("fcfs", model, hardware, seed=seed)
    else:
        policy = make_offline_policy(args.offline_policy, model, hardware, seed=seed)
    rate = value if config in ("hygen-star", BASELINE) else None
    engine_config = ColocatedConfig(setup.cost.kv_capacity_tokens(), chunk_tokens=args.chunk,
                                    max_running=args.max_running, offline_rate=rate,
                                    mixed=not config.startswith("sglang-priority"))
    clock = MeteredClock(setup.step, args.jitter, seed)
    engine = ColocatedEngine(clock, ColocationController(colocation), policy if offline else None, engine_config)
    return Run(engine.run(arrivals, offline, args.duration), clock.busy_s)


def measured(run: Run, pool: int, series: bool = False) -> dict[str, Any]:
    """What the table reports of one run: online latencies, offline tokens/s, utilisation."""
    result = run.result
    summary = {**summarize(result.online), "offline_tokens_per_s": result.offline_tokens_per_s(),
               "utilisation": run.busy_s / result.seconds if result.seconds else 0.0,
               "iterations": result.iterations, "counts": result.counts,
               "pool_exhausted": pool > 0 and result.counts.get("offline_finished", 0) >= pool}
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


def run_config(setup: Setup, arrivals: Sequence[OnlineArrival], config: str, value: float | None, seed: int,
               reference: dict[str, Any] | None, series: bool = False) -> dict[str, Any]:
    """`measured` of one simulation. A run the engine gives up on (it raises when online work can
    no longer be served) counts as missing every SLO, with the reason kept, so one stuck
    configuration neither stops the bench nor passes a search."""
    pool = 0 if config.endswith("online-only") else len(setup.offline)
    try:
        return measured(simulate(setup, arrivals, config, value, seed, reference), pool, series)
    except RuntimeError as error:
        failed = {metric: math.inf for metric in METRICS}
        return {**failed, "requests": len(arrivals), "completed": 0, "errors": len(arrivals),
                "offline_tokens_per_s": 0.0, "utilisation": 0.0, "iterations": 0, "counts": {},
                "pool_exhausted": False, "failed": str(error),
                **({"series": {"online": [], "offline_tok_s": []}} if series else {})}


def knob_range(args: argparse.Namespace, config: str) -> tuple[float, float]:
    if config == "hygen":
        return args.low_headroom_ms / 1000, args.high_headroom_ms / 1000
    if config == "echo":
        return args.low_echo_scale, args.high_scale
    if config == "bros":
        return args.low_bros_scale, args.high_scale
    return args.low_rate, args.high_rate


def searched(setup: Setup, arrivals: Sequence[OnlineArrival], config: str, slos: list[SLO],
             reference: dict[str, Any]) -> dict[str, Any]:
    """The core SLO search over ``config``'s knob on the tuning trace. If not even the lowest
    value meets the SLOs, the lowest is what the evaluation runs (``met`` False says so)."""
    trials: list[dict[str, Any]] = []
    low, high = knob_range(setup.args, config)

    def evaluate(value: float) -> dict[str, Any]:
        result = run_config(setup, arrivals, config, value, TUNE_SEED, reference)
        trials.append({"value": value, **result})
        return result

    steps = steps_for(low, high, setup.args.resolution)
    outcome = search_budget(evaluate, slos, setup.args.tolerance, low, high, steps)
    return {"knob": HEADROOM_KNOB if config == "hygen" else KNOB_NAMES[config], "range": [low, high], "steps": steps,
            "value": outcome.budget_s if outcome.budget_s is not None else low,
            "met": outcome.budget_s is not None, "binding": outcome.binding, "trials": trials}


def cell(task: tuple[str, float, float]) -> dict[str, Any]:
    """Every configuration at one arrival pattern and online rate (picked for ``target``)."""
    pattern, rate, target = task
    setup, args = _SETUP, _SETUP.args
    started = time.monotonic()
    tune = online_arrivals(setup, pattern, rate, seed=TUNE_SEED)
    evaluation = online_arrivals(setup, pattern, rate, seed=EVAL_SEED)
    tune_reference = run_config(setup, tune, "online-only", None, TUNE_SEED, None)
    tune_slos = [SLO(metric, tune_reference[metric]) for metric in args.slo]
    searches = {config: searched(setup, tune, config, tune_slos, tune_reference) for config in SEARCHED}
    runs = {"online-only": run_config(setup, evaluation, "online-only", None, EVAL_SEED, None, series=True)}
    for config in SEARCHED:
        runs[config] = run_config(setup, evaluation, config, searches[config]["value"], EVAL_SEED, tune_reference,
                                  series=True)
    for config in REFERENCES:
        runs[config] = run_config(setup, evaluation, config, None, EVAL_SEED, None, series=True)
    slos = [SLO(metric, runs["online-only"][metric]) for metric in args.slo]
    for run in runs.values():
        run["slos_violated"] = violations(run, slos, args.tolerance)
    settings = {config: slo_settings(config, searches[config]["value"], tune_reference) for config in ("echo", "bros")}
    return {"pattern": pattern, "rate_per_s": rate, "target_utilisation": target, "online_requests": len(evaluation),
            "tune_reference": tune_reference, "search": searches, "slo_settings_s": settings, "runs": runs,
            "wall_s": round(time.monotonic() - started, 1)}


def markdown(report: dict[str, Any]) -> str:
    lines = markdown_results(report, "offline tok/s", ", ".join(report["slo_metrics"]))
    lines.append("")
    lines.append("Loads (online-only utilisation of the evaluation trace, picked by bisecting the rate): "
                 + "; ".join(f"{pick['pattern']} {pick['target']:.0%} -> {pick['rate_per_s']:.3g} req/s "
                             f"({pick['utilisation']:.1%})" for pick in report["load_picks"]) + ".")
    lines.append(f"Latency model ({report['latency_fit']['best']}) held-out MAPE: "
                 + ", ".join(f"{form} {fit['holdout_mape']:.1%}" for form, fit in report["latency_fit"]["forms"].items())
                 + ".")
    lines.append("")
    lines += markdown_goal(report["targets"])
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    shown = [c for c in report["cells"] if c["target_utilisation"] == report["plot_target"]]
    fig, axes = latency_figure(len(shown))
    for column, result in enumerate(shown):
        for config in CONFIGS:
            series = result["runs"][config]["series"]
            plot_online(axes, column, config, series["online"], marker_size=2)
            if series["offline_tok_s"]:
                at, rate = zip(*series["offline_tok_s"], (report["duration_s"], series["offline_tok_s"][-1][1]))
                axes[2, column].step(at, rate, where="post", color=CONFIG_COLORS[config])
        label_column(axes, column, f"{result['pattern']} arrivals, {result['rate_per_s']:.3g} req/s online "
                     f"({result['runs']['online-only']['utilisation']:.0%} busy online-only)",
                     "offline tok/s", "simulated seconds")
    save_figure(fig, axes, f"Simulated co-location, {report['model']} on {report['hardware']}: online latency and "
                "offline throughput over time", path)


def build_setup(args: argparse.Namespace) -> tuple[Setup, dict[str, Any]]:
    cost = CostModel(model_spec(args.model), HardwareSpec.resolve(args.hardware))
    step = StepTime.of(cost, overlap_function(args.overlap))
    fit = fit_latency(NoisyClock(step, args.jitter, seed=args.seed + 100), args.profile_batches, args.seed)
    latency_model = fit.models[fit.best_form()].to_dict()
    swap = SwapModel.fit(H100_H2D_SAMPLES, cost.model.kv_bytes_per_token)
    online_pool = sharegpt.load(args.online_pool, args.seed)
    offline = named_workload(args.offline_trace, args.offline_n, cost, args.seed)
    return Setup(args, cost, step, latency_model, fit.models["bros"], swap, online_pool, offline), fit.to_dict()


def pick_loads(setup: Setup, patterns: Sequence[str]) -> list[dict[str, Any]]:
    """One online rate per (pattern, target utilisation), measured on the evaluation trace's
    online-only runs: the load is a property of the run the table reports, not a tuned knob."""
    args = setup.args
    picks = []
    for pattern in patterns:
        def utilisation_at(rate: float) -> float:
            return run_config(setup, online_arrivals(setup, pattern, rate, EVAL_SEED), "online-only", None, EVAL_SEED,
                              None)["utilisation"]

        for target in args.targets:
            pick = pick_rate(utilisation_at, target, args.low_load, args.high_load, args.load_steps,
                             args.load_tolerance)
            picks.append({"pattern": pattern, **pick.to_dict()})
    return picks


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--overlap", default="sum", help="how compute and memory time combine in one iteration")
    parser.add_argument("--jitter", type=float, default=0.02, help="log-normal sigma of measured iteration times")
    parser.add_argument("--profile-batches", type=int, default=400, help="timed batches the latency model is fitted on")
    parser.add_argument("--targets", default="0.25,0.4,0.55",
                        help="online-only engine utilisations the three loads are picked for")
    parser.add_argument("--patterns", default="poisson", help="arrival patterns, comma-separated (poisson,bursty)")
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of online arrivals per run")
    parser.add_argument("--period", type=float, default=30.0, help="bursty: seconds per high+low cycle")
    parser.add_argument("--offline-trace", default="trace1", help="trace1..trace4 (Table 2) or DENSITY:SHARING")
    parser.add_argument("--offline-n", type=int, default=None,
                        help="offline pool size (default: 100 per second of trace, more than any run finishes)")
    parser.add_argument("--offline-policy", default="psm", help="hygen's and echo's offline order")
    parser.add_argument("--online-pool", type=int, default=2000, help="ShareGPT conversations online requests come from")
    parser.add_argument("--chunk", type=int, default=512, help="tokens per iteration (chunked prefill size), every config")
    parser.add_argument("--max-running", type=int, default=256)
    parser.add_argument("--slo", default="ttft_p99,tbt_p99", help="SLO metrics, comma-separated")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--resolution", type=float, default=1.25,
                        help="every search bisects until its bracket's high/low ratio is at most this")
    parser.add_argument("--low-headroom-ms", type=float, default=0.05,
                        help="HyGen's headroom over the predicted online-only iteration, lowest")
    parser.add_argument("--high-headroom-ms", type=float, default=40.0)
    add_deadline_scale_arguments(parser)
    parser.add_argument("--low-rate", type=float, default=0.02, help="searched offline release rate (req/s), lowest")
    parser.add_argument("--high-rate", type=float, default=10.0)
    parser.add_argument("--low-load", type=float, default=0.02, help="online req/s the load picker starts from")
    parser.add_argument("--high-load", type=float, default=20.0)
    parser.add_argument("--load-steps", type=int, default=10, help="online-only runs per picked load, at most")
    parser.add_argument("--load-tolerance", type=float, default=0.02, help="how close to its target a load must be")
    parser.add_argument("--workers", type=int, default=2, help="processes running (pattern, load) cells")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 60 s traces, coarse searches (resolution 4), a smaller latency profile")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default bench/results/colocation_sim.json; with --quick, a temp dir)")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.resolution, args.profile_batches, args.online_pool = 60.0, 4.0, 200, 500
    if args.out is None:
        args.out = (Path(tempfile.gettempdir()) / "colocation_sim-quick.json") if args.quick \
            else RESULTS / "colocation_sim.json"
    args.slo = [metric.strip() for metric in args.slo.split(",") if metric.strip()]
    args.targets = [float(target) for target in args.targets.split(",")]
    args.patterns = [pattern.strip() for pattern in args.patterns.split(",") if pattern.strip()]
    if args.offline_n is None:
        args.offline_n = int(100 * args.duration)
    return args


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    global _SETUP
    _SETUP, fit = build_setup(args)
    picks = pick_loads(_SETUP, args.patterns)
    tasks = [(pick["pattern"], pick["rate_per_s"], pick["target"]) for pick in picks]
    if args.workers > 1:
        with multiprocessing.get_context("fork").Pool(min(args.workers, len(tasks))) as pool:
            cells = pool.map(cell, tasks, chunksize=1)
    else:
        cells = [cell(task) for task in tasks]
    report = {"model": args.model, "hardware": args.hardware, "overlap": args.overlap, "jitter": args.jitter,
              "duration_s": args.duration, "period_s": args.period, "offline_trace": args.offline_trace,
              "offline_n": args.offline_n, "chunk": args.chunk, "max_running": args.max_running,
              "kv_capacity_tokens": _SETUP.cost.kv_capacity_tokens(), "slo_metrics": args.slo,
              "tolerance": args.tolerance, "search_resolution": args.resolution, "latency_fit": fit,
              "swap_model": vars(_SETUP.swap), "load_picks": picks,
              "plot_target": sorted(args.targets)[len(args.targets) // 2], "cells": cells}
    for result in cells:
        if result["target_utilisation"] != report["plot_target"]:
            for run in result["runs"].values():
                run.pop("series")
    report["table"] = table(cells)
    report["targets"] = targets(cells)
    report["wall_s"] = round(time.monotonic() - started, 1)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    report = run_bench(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report) + "\n")
    plot(report, args.out.with_suffix(".png"))
    print(markdown(report))
    print(f"wall time {report['wall_s']} s -> {args.out}")


if __name__ == "__main__":
    main()
