"""Co-location on the real CPU engine: online latency and offline throughput, HyGen vs two baselines.

Online load: ShareGPT prompts, Poisson arrivals, and bursty arrivals whose rate swings 3x every
half period. Offline load: few-shot batch lines with shared prefixes and mixed output lengths
(compute-heavy 1-4 token answers beside memory-heavy 48-128 token ones: a Table-2 mix at CPU
scale). Every configuration replays the same traces; SLOs are P99 TTFT and P99 TBT within
``--tolerance`` of online-only serving on the same server.

- online-only: the co-location server with no offline work (the SLO reference);
- hygen: closed-loop offline load; the latency budget is the largest that meets the SLOs on the
  Poisson trace (the SLO profiler's search), then kept for the bursty trace;
- hygen-star: the same server without a budget, offline requests at a fixed rate, the largest
  rate that meets the same SLOs (HyGen's HyGen*);
- sglang-priority: SGLang's own ``--enable-priority-scheduling --schedule-policy fcfs``, online
  requests at high priority, offline at low, closed loop.

Writes ``bench/results/colocation.json``, ``colocation.png`` (online latency and offline
throughput over time) and ``colocation.md`` (the table).

    sgl-blend profile --latency --model tiny-llama --out bench/results/latency-model.json
    python -m bench.colocation --latency-model bench/results/latency-model.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from sgl_blend.client import http
from sgl_blend.workloads.batch_files import fewshot_lines
from sgl_blend.workloads.sharegpt import first_exchange, iter_conversations
from bench.colocation_plot import CONFIG_COLORS, label_column, latency_figure, plot_online, save_figure
from sgl_blend.workloads.arrivals import arrival_times
from sgl_blend.jobs.lines import BatchLine, parse_line
from sgl_blend.launch.colocation import colocation_launch, with_free_port
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.latency_model import load_model
from sgl_blend.core.slo_search import SLO, search_budget, violations
from sgl_blend.measure.online_replay import OfflineLoad, OnlineRequest, RequestTiming, replay_with_offline, summarize
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings
from sgl_blend.measure.slo_profiler import set_colocation

RESULTS = Path(__file__).parent / "results"
SLO_METRICS = ("ttft_p99", "tbt_p99")
ONLINE_PRIORITY, OFFLINE_PRIORITY = 100, 0
THROUGHPUT_BIN_S = 5.0


def sharegpt_prompts(n: int, seed: int, max_chars: int, max_tokens_cap: int) -> list[tuple[str, int]]:
    """First human turns and their reply lengths (about four characters a token), capped."""
    prompts = []
    for conversation in iter_conversations(limit=4 * n):
        exchange = first_exchange(conversation)
        if exchange is not None:
            prompts.append((exchange[0][:max_chars], max(4, min(max_tokens_cap, len(exchange[1]) // 4))))
    random.Random(seed).shuffle(prompts)
    return prompts[:n]


def online_trace(pattern: str, rate: float, duration_s: float, period_s: float, prompts: Sequence[tuple[str, int]],
                 seed: int) -> list[OnlineRequest]:
    """ShareGPT prompts at `arrival_times` of ``pattern`` (Poisson, or bursty with 3x swings)."""
    times = arrival_times(pattern, rate, duration_s, period_s, seed)
    return [OnlineRequest(t, *prompts[index % len(prompts)]) for index, t in enumerate(times)]


def offline_lines(n: int, seed: int) -> list[BatchLine]:
    lines = [parse_line(json.dumps(line), number, ("/v1/completions",))
             for number, line in enumerate(fewshot_lines(n=n, groups=8, seed=seed), start=1)]
    return [line for line in lines if isinstance(line, BatchLine)]


def run_trial(server: ServerProcess, trace: Sequence[OnlineRequest], lines: Sequence[BatchLine] | None, *,
              concurrency: int = 64, rate: float | None = None, priority: bool = False) -> dict[str, Any]:
    """One replay: online metrics, offline throughput, and the time series for the plot."""

    async def go() -> tuple[list[RequestTiming], dict[str, float], OfflineLoad | None]:
        offline = None
        if lines:
            offline = OfflineLoad(server.base_url, lines, concurrency=concurrency, rate_per_s=rate,
                                  priority=OFFLINE_PRIORITY if priority else None)
        timings, throughput = await replay_with_offline(server.base_url, trace, offline,
                                                        priority=ONLINE_PRIORITY if priority else None)
        return timings, throughput, offline

    timings, throughput, offline = asyncio.run(go())
    start = throughput.pop("start")
    series = {
        "online": [{"t": round(timing.sent_at - start, 3), "ttft": timing.ttft,
                    "tbt": (sum(timing.gaps) / len(timing.gaps)) if timing.gaps else None} for timing in timings],
        "offline_tokens": [(round(at - start, 3), tokens) for at, tokens in (offline.completions if offline else [])
                           if at >= start],
    }
    return {**summarize(timings), **throughput, "offline_errors": offline.errors if offline else 0, "series": series}


def plugin_counts(server: ServerProcess) -> dict[str, Any]:
    state = http.server_info(server.base_url, server.api_key)["internal_states"][0].get("sgl_blend") or {}
    return (state.get("colocation") or {}).get("counts", {})


def slo_targets(reference: dict[str, Any]) -> list[SLO]:
    return [SLO(metric, reference[metric]) for metric in SLO_METRICS]


def tuned(evaluate: Callable[[float], dict[str, Any]], slos: list[SLO], tolerance: float, low: float, high: float,
          steps: int) -> tuple[float | None, list[dict[str, Any]]]:
    """The SLO profiler's search (shared with `tune-slo`), keeping every trial's full result."""
    trials: list[dict[str, Any]] = []

    def record(value: float) -> dict[str, Any]:
        result = evaluate(value)
        trials.append({"value": value, **result})
        return result

    outcome = search_budget(record, slos, tolerance, low, high, steps)
    return outcome.budget_s, trials


def engine_args(args: argparse.Namespace) -> list[str]:
    """The engine every configuration shares: KV pool and prefill chunk size."""
    return ["--max-total-tokens", str(args.kv_tokens), "--chunked-prefill-size", str(args.chunk)]


def colocation_runs(args: argparse.Namespace, traces: dict[str, list[OnlineRequest]], lines: list[BatchLine],
                    work: Path) -> dict[str, Any]:
    model = load_model(args.latency_model).to_dict()
    settings = PluginSettings(offline_policy="psm", psm_utility=args.utility,
                              colocation=ColocationConfig(mode="hygen", latency_model=model))
    sglang_args = colocation_launch(settings, with_free_port(engine_args(args)))
    server = start_server(args.model, sglang_args, log_path=work / "colocation-server.log", settings=settings)
    runs: dict[str, Any] = {}
    try:
        for pattern, trace in traces.items():
            runs[f"online-only/{pattern}"] = run_trial(server, trace, None)
        slos = {pattern: slo_targets(runs[f"online-only/{pattern}"]) for pattern in traces}

        def with_budget(budget_s: float) -> dict[str, Any]:
            set_colocation(server.base_url, {"latency_budget_s": budget_s})
            return run_trial(server, traces["poisson"], lines, concurrency=args.concurrency)

        budget, trials = tuned(with_budget, slos["poisson"], args.tolerance, args.low_budget_ms / 1000,
                               args.high_budget_ms / 1000, args.steps)
        runs["hygen/search"] = _strip_series(trials)
        chosen = budget if budget is not None else args.low_budget_ms / 1000
        runs["hygen/poisson"] = _trial_at(trials, chosen) or with_budget(chosen)
        set_colocation(server.base_url, {"latency_budget_s": chosen})
        runs["hygen/bursty"] = run_trial(server, traces["bursty"], lines, concurrency=args.concurrency)
        runs["hygen/budget_s"] = chosen
        runs["hygen/counts"] = plugin_counts(server)

        set_colocation(server.base_url, {"latency_budget_s": None})

        def at_rate(rate: float) -> dict[str, Any]:
            return run_trial(server, traces["poisson"], lines, concurrency=args.concurrency, rate=rate)

        rate, rate_trials = tuned(at_rate, slos["poisson"], args.tolerance, args.low_rate, args.high_rate, args.steps)
        runs["hygen-star/search"] = _strip_series(rate_trials)
        chosen_rate = rate if rate is not None else args.low_rate
        runs["hygen-star/poisson"] = _trial_at(rate_trials, chosen_rate) or at_rate(chosen_rate)
        runs["hygen-star/bursty"] = run_trial(server, traces["bursty"], lines, concurrency=args.concurrency,
                                              rate=chosen_rate)
        runs["hygen-star/rate_per_s"] = chosen_rate
    finally:
        server.stop()
    return runs


def priority_runs(args: argparse.Namespace, traces: dict[str, list[OnlineRequest]], lines: list[BatchLine],
                  work: Path) -> dict[str, Any]:
    server = start_server(args.model, with_free_port([*engine_args(args), "--enable-priority-scheduling",
                                                      "--schedule-policy", "fcfs"]),
                          log_path=work / "priority-server.log", settings=PluginSettings(offline_policy=OFF))
    try:
        return {f"sglang-priority/{pattern}": run_trial(server, trace, lines, concurrency=args.concurrency,
                                                        priority=True) for pattern, trace in traces.items()}
    finally:
        server.stop()


def _trial_at(trials: list[dict[str, Any]], value: float) -> dict[str, Any] | None:
    return next((trial for trial in trials if trial["value"] == value), None)


def _strip_series(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in trial.items() if key != "series"} for trial in trials]


def table(report: dict[str, Any]) -> list[dict[str, Any]]:
    runs, tolerance = report["runs"], report["tolerance"]
    rows = []
    for pattern in ("poisson", "bursty"):
        reference = runs[f"online-only/{pattern}"]
        for config in ("online-only", "hygen", "hygen-star", "sglang-priority"):
            run = runs[f"{config}/{pattern}"]
            rows.append({
                "pattern": pattern, "config": config,
                **{metric: round(run[metric] * 1000, 1) for metric in ("ttft_mean", "ttft_p99", "tbt_mean", "tbt_p99")},
                "offline_tok_s": round(run["offline_tokens_per_s"], 1),
                "slos_met": not violations(run, slo_targets(reference), tolerance),
                "completed": f"{run['completed']}/{run['requests']}",
            })
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = ["| trace | config | TTFT mean / P99 (ms) | TBT mean / P99 (ms) | offline tok/s | SLOs met | online done |",
             "|---|---|---|---|---|---|---|"]
    for row in report["table"]:
        lines.append(f"| {row['pattern']} | {row['config']} | {row['ttft_mean']} / {row['ttft_p99']} | "
                     f"{row['tbt_mean']} / {row['tbt_p99']} | {row['offline_tok_s']} | "
                     f"{'yes' if row['slos_met'] else 'no'} | {row['completed']} |")
    runs = report["runs"]
    lines.append("")
    lines.append(f"SLOs: P99 TTFT and P99 TBT within {report['tolerance']:.0%} of online-only on the same trace. "
                 f"hygen budget {runs['hygen/budget_s'] * 1000:.1f} ms (searched on the Poisson trace); "
                 f"hygen-star fixed offline rate {runs['hygen-star/rate_per_s']:.2f} req/s.")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    fig, axes = latency_figure(2)
    for column, pattern in enumerate(("poisson", "bursty")):
        for config in CONFIG_COLORS:
            series = report["runs"][f"{config}/{pattern}"]["series"]
            plot_online(axes, column, config, series["online"], marker_size=3)
            bins: dict[int, int] = {}
            for at, tokens in series["offline_tokens"]:
                bins[int(at // THROUGHPUT_BIN_S)] = bins.get(int(at // THROUGHPUT_BIN_S), 0) + tokens
            if bins:
                keys = sorted(bins)
                axes[2, column].step([k * THROUGHPUT_BIN_S for k in keys], [bins[k] / THROUGHPUT_BIN_S for k in keys],
                                     where="post", color=CONFIG_COLORS[config])
        label_column(axes, column, f"{pattern} online arrivals", "offline output tok/s", "seconds into the replay")
    save_figure(fig, axes, f"{report['model']}: online latency and offline throughput over time", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--latency-model", type=Path, default=RESULTS / "latency-model.json")
    parser.add_argument("--rate", type=float, default=1.0, help="mean online arrivals per second")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of online trace per replay")
    parser.add_argument("--period", type=float, default=20.0, help="bursty trace: seconds per high+low cycle")
    parser.add_argument("--tolerance", type=float, default=0.25)
    parser.add_argument("--steps", type=int, default=1, help="bisection steps per search after both ends")
    parser.add_argument("--low-budget-ms", type=float, default=20.0)
    parser.add_argument("--high-budget-ms", type=float, default=400.0)
    parser.add_argument("--low-rate", type=float, default=0.2, help="HyGen* offline requests per second, lowest")
    parser.add_argument("--high-rate", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64, help="closed-loop offline requests in flight")
    parser.add_argument("--utility", type=float, default=0.9, help="PSM utility u for the offline order")
    parser.add_argument("--kv-tokens", type=int, default=16384)
    parser.add_argument("--chunk", type=int, default=512,
                        help="SGLang --chunked-prefill-size for every server (Sarathi-style chunks, as in HyGen)")
    parser.add_argument("--offline-n", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "colocation.json")
    args = parser.parse_args()
    work = args.out.parent / f"{args.out.stem}-work"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    prompts = sharegpt_prompts(400, args.seed, max_chars=600, max_tokens_cap=48)
    traces = {pattern: online_trace(pattern, args.rate, args.duration, args.period, prompts, args.seed)
              for pattern in ("poisson", "bursty")}
    lines = offline_lines(args.offline_n, args.seed)
    runs = colocation_runs(args, traces, lines, work)
    runs.update(priority_runs(args, traces, lines, work))
    report = {"model": args.model, "rate_per_s": args.rate, "duration_s": args.duration, "period_s": args.period,
              "tolerance": args.tolerance, "kv_tokens": args.kv_tokens, "chunk": args.chunk, "online_requests": {p: len(t) for p, t in traces.items()},
              "offline_lines": len(lines), "runs": runs}
    report["table"] = table(report)
    report["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report) + "\n")
    plot(report, args.out.with_suffix(".png"))
    print(markdown(report))
    print(f"wall time {report['wall_s']} s -> {args.out}")


if __name__ == "__main__":
    main()
