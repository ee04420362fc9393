"""Co-location on the real CPU engine, judged at equal SLO: HyGen, Echo and BROS against SGLang's
priority scheduling with its offline rate searched, at three online loads named by engine utilisation.

Online load: ShareGPT prompts (first human turns, reply lengths capped) at Poisson arrivals.
Offline load: few-shot batch lines with shared prefixes and mixed output lengths (1-4 token answers
beside 48-128 token ones: a Table-2 mix at CPU scale), cycled so it never runs out. Every server
has the same KV pool (``--kv-tokens``) and prefill chunk (``--chunk``).

Loads: the engine's utilisation is its forward time over wall time, read from the scheduler's
per-iteration records (`sglang_plugin.iteration_log`, appended to a JSONL file per server). At low
load it grows linearly with the rate (each request costs the engine its own forward time), so one
online-only probe at ``--probe-rate`` gives the engine seconds per request and each target
utilisation (default 25%, 40%, 55%) its rate; every online-only reference run then measures the
utilisation it really had (JSON and table), which is what the 20-60% band is judged on.

Configurations (SLO: P99 TTFT and P99 TBT within ``--tolerance``, 25%, of online-only):

- online-only: the co-location server with no offline work, on each trace (the SLO reference);
- hygen: that server in HyGen mode, PSM order, closed-loop offline load; budget searched;
- hygen-star: the same server without a budget, offline requests at a fixed rate; rate searched;
- echo: a server in Echo mode; its TTFT/TPOT deadlines and idle cap are ``k`` times the tuning
  trace's online-only P99 TTFT / P99 TBT, ``k`` searched (moved on the live server);
- bros: a server in BROS mode (no radix cache, as that mode runs); its RT SLOs and idle cap are ``k`` times the
  same references, ``k`` searched -- the mode reads its SLOs at start, so each ``k`` is a fresh server;
- sglang-priority-searched: SGLang's own ``--enable-priority-scheduling --schedule-policy fcfs``
  (online high priority, offline low, no mixed chunks), offline requests at a fixed rate, searched;
- sglang-priority-unbounded and sglang-priority-online-only: the same server with a closed
  offline loop, and with no offline work (reference rows).

Every search is the core SLO search (`core.slo_search.search_budget`, log bisection) on a tuning
trace (another seed) against that trace's online-only run; the table is a fresh evaluation trace
against its own online-only run. Offline throughput here is output tokens per second of offline
requests that completed inside the online replay's window (what the client sees).

Budget. A replay is ``--duration`` seconds of online arrivals plus the time the last answers take
(and 2 s of offline warm-up). A search costs ``2 + steps`` replays, ``steps = steps_for(low, high,
--resolution)`` (with the defaults: 1 step for the budget and for ``k``, 2 for rates), and each
searched configuration one evaluation replay more. Per load: 2 references, 5 searches of 3-4
trials, 5 evaluations and the 2 reference rows -- about 25 replays; with 30 s traces about 14 minutes
a load, 3 loads about 45 minutes including the servers' starts (BROS: one per ``k`` tried).
``--quick`` (one load, 15 s traces, no bisection steps) is a smoke run of about 10 minutes.

    sgl-blend profile --latency --model tiny-llama --out bench/results/latency-model.json
    python -m bench.colocation --latency-model bench/results/latency-model.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from bench.colocation_judge import (
    BASELINE, CONFIGS, KNOB_NAMES, add_deadline_scale_arguments, markdown_goal, markdown_results, table, targets,
)
from bench.colocation_plot import CONFIG_COLORS, label_column, latency_figure, plot_online, save_figure
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.latency_model import load_model
from sgl_blend.core.slo_search import METRICS, SLO, search_budget, steps_for, violations
from sgl_blend.batch_lines.lines import BatchLine, parse_line
from sgl_blend.launch.colocation import colocation_launch, with_free_port
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.measure.online_replay import OfflineLoad, OnlineRequest, RequestTiming, replay_with_offline, summarize
from sgl_blend.measure.slo_profiler import set_colocation
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings
from sgl_blend.workloads.arrivals import arrival_times
from sgl_blend.workloads.batch_files import fewshot_lines
from sgl_blend.workloads.sharegpt import first_exchange, iter_conversations

RESULTS = Path(__file__).parent / "results"
SLO_METRICS = ("ttft_p99", "tbt_p99")
ONLINE_PRIORITY, OFFLINE_PRIORITY = 100, 0
THROUGHPUT_BIN_S = 5.0
# Before each replay: no batch for 1 s (the scheduler sleeps when idle, so the record stops), at
# most 180 s (64 leftover offline requests of <= 128 tokens drain well within it on this CPU).
IDLE_QUIET_S, IDLE_TIMEOUT_S = 1.0, 180.0
PATTERN = "poisson"
TUNE_SEED, EVAL_SEED = 1, 2


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


@dataclass
class Engine:
    """A running server and the JSONL file its scheduler appends one record per batch to."""

    server: ServerProcess
    records: Path

    def last_batch_at(self) -> float | None:
        """Wall time the last recorded batch ended (None: none yet)."""
        if not self.records.exists() or not self.records.stat().st_size:
            return None
        with self.records.open("rb") as handle:
            handle.seek(max(self.records.stat().st_size - 4096, 0))
            tail = handle.read().decode(errors="replace").strip().splitlines()
        for line in reversed(tail):
            try:
                return float(json.loads(line)["wall"])
            except (ValueError, KeyError):
                continue
        return None

    def wait_idle(self, quiet_s: float, timeout_s: float) -> float:
        """Wait until no batch has run for ``quiet_s``: the previous trial's offline requests (a
        client that stops does not stop the ones the server already runs) must not load the next
        one. Returns the seconds waited (``timeout_s`` at most)."""
        started = time.time()
        while time.time() - started < timeout_s:
            last = self.last_batch_at()
            if last is None or time.time() - last >= quiet_s:
                break
            time.sleep(quiet_s / 4)
        return time.time() - started

    def size(self) -> int:
        return self.records.stat().st_size if self.records.exists() else 0

    def busy_s(self, start: float, end: float, offset: int = 0) -> float:
        """Forward time of the batches that ended in ``[start, end]`` (wall clock), reading the
        records from byte ``offset`` on (where they stood before the replay)."""
        if not self.records.exists():
            return 0.0
        busy = 0.0
        with self.records.open() as handle:
            handle.seek(offset)
            for line in handle:
                record = json.loads(line)
                if start <= record.get("wall", 0.0) <= end:
                    busy += record.get("forward_s", 0.0)
        return busy


@contextmanager
def serving(name: str, args: argparse.Namespace, sglang_args: Sequence[str], settings: PluginSettings,
            work: Path) -> Iterator[Engine]:
    records = work / f"{name}.records.jsonl"
    records.unlink(missing_ok=True)
    settings = settings.updated(iteration_log=str(records))
    server = start_server(args.model, with_free_port(sglang_args), log_path=work / f"{name}.log", settings=settings)
    try:
        yield Engine(server, records)
    finally:
        server.stop()


def run_trial(engine: Engine, trace: Sequence[OnlineRequest], lines: Sequence[BatchLine] | None, *,
              concurrency: int, rate: float | None = None, priority: bool = False) -> dict[str, Any]:
    """One replay: online metrics, offline output tokens/s, engine utilisation, and the time series
    for the plot. A replay that raises (a server gone) counts as missing every SLO."""

    async def go() -> tuple[list[RequestTiming], dict[str, float], OfflineLoad | None]:
        offline = None
        if lines:
            offline = OfflineLoad(engine.server.base_url, lines, concurrency=concurrency, rate_per_s=rate,
                                  priority=OFFLINE_PRIORITY if priority else None)
        timings, throughput = await replay_with_offline(engine.server.base_url, trace, offline,
                                                        priority=ONLINE_PRIORITY if priority else None)
        return timings, throughput, offline

    drained_s = engine.wait_idle(IDLE_QUIET_S, IDLE_TIMEOUT_S)
    offset = engine.size()
    try:
        timings, throughput, offline = asyncio.run(go())
    except Exception as error:  # noqa: BLE001 -- any failure of a replay is a failed run, reported
        return {**{metric: math.inf for metric in METRICS}, "requests": len(trace), "completed": 0,
                "errors": len(trace), "offline_tokens_per_s": 0.0, "utilisation": 0.0,
                "failed": f"{type(error).__name__}: {error}", "series": {"online": [], "offline_tokens": []}}
    start = throughput.pop("start")
    wall_start = time.time() - (time.perf_counter() - start)
    busy = engine.busy_s(wall_start, wall_start + throughput["window_s"], offset)
    series = {
        "online": [{"t": round(timing.sent_at - start, 3), "ttft": timing.ttft,
                    "tbt": (sum(timing.gaps) / len(timing.gaps)) if timing.gaps else None} for timing in timings],
        "offline_tokens": [(round(at - start, 3), tokens) for at, tokens in (offline.completions if offline else [])
                           if at >= start],
    }
    return {**summarize(timings), **throughput, "utilisation": busy / throughput["window_s"],
            "offline_errors": offline.errors if offline else 0, "waited_idle_s": round(drained_s, 1),
            "series": series}


def slo_targets(reference: dict[str, Any]) -> list[SLO]:
    return [SLO(metric, reference[metric]) for metric in SLO_METRICS]


def searched(config: str, evaluate: Callable[[float], dict[str, Any]], slos: list[SLO], low: float, high: float,
             args: argparse.Namespace) -> dict[str, Any]:
    """The core SLO search over ``config``'s knob; the lowest value if none meets the SLOs."""
    trials: list[dict[str, Any]] = []

    def record(value: float) -> dict[str, Any]:
        result = evaluate(value)
        trials.append({"value": value, **{k: v for k, v in result.items() if k != "series"}})
        return result

    steps = steps_for(low, high, args.resolution)
    outcome = search_budget(record, slos, args.tolerance, low, high, steps)
    return {"knob": KNOB_NAMES[config], "range": [low, high], "steps": steps,
            "value": outcome.budget_s if outcome.budget_s is not None else low,
            "met": outcome.budget_s is not None, "binding": outcome.binding, "trials": trials}


def engine_args(args: argparse.Namespace) -> list[str]:
    """The engine every configuration shares: KV pool and prefill chunk size."""
    return ["--max-total-tokens", str(args.kv_tokens), "--chunked-prefill-size", str(args.chunk)]


def slo_scaled(value: float, reference: dict[str, Any]) -> dict[str, float]:
    """Echo's and BROS's SLO settings: ``value`` times the references; both cap an iteration no
    online deadline bounds at the TPOT deadline (the same knob for both)."""
    tpot = value * reference["tbt_p99"]
    return {"ttft_slo_s": value * reference["ttft_p99"], "tpot_slo_s": tpot, "idle_budget_s": tpot}


@dataclass
class Load:
    rate: float
    target: float
    tune: list[OnlineRequest]
    evaluation: list[OnlineRequest]
    tune_reference: dict[str, Any] | None = None
    eval_reference: dict[str, Any] | None = None


def pick_loads(engine: Engine, args: argparse.Namespace, prompts: Sequence[tuple[str, int]]) -> tuple[list[Load], dict]:
    """The probe: online-only at ``--probe-rate``; engine seconds per request; a rate per target."""
    probe = run_trial(engine, online_trace(PATTERN, args.probe_rate, args.duration, args.duration, prompts, EVAL_SEED),
                      None, concurrency=args.concurrency)
    per_request = probe["utilisation"] * probe["window_s"] / max(probe["requests"], 1)
    loads = []
    for target in args.targets:
        rate = target / per_request if per_request > 0 else args.probe_rate
        loads.append(Load(rate, target, *(online_trace(PATTERN, rate, args.duration, args.duration, prompts, seed)
                                          for seed in (TUNE_SEED, EVAL_SEED))))
    summary = {"probe_rate_per_s": args.probe_rate, "probe_utilisation": probe["utilisation"],
               "engine_s_per_request": per_request, "rates": {str(load.target): load.rate for load in loads}}
    return loads, summary


def colocation_runs(args: argparse.Namespace, loads_out: list[Load], prompts: Sequence[tuple[str, int]],
                    lines: list[BatchLine], work: Path) -> tuple[dict[int, dict[str, Any]], dict]:
    """The HyGen-mode server: the load probe, every online-only reference, hygen and hygen-star."""
    model = load_model(args.latency_model).to_dict()
    settings = PluginSettings(offline_policy="psm", psm_utility=args.utility,
                              colocation=ColocationConfig(mode="hygen", latency_model=model))
    cells: dict[int, dict[str, Any]] = {}
    with serving("hygen", args, colocation_launch(settings, engine_args(args)), settings, work) as engine:
        loads, probe = pick_loads(engine, args, prompts)
        loads_out.extend(loads)
        url = engine.server.base_url
        for index, load in enumerate(loads):
            set_colocation(url, {"latency_budget_s": None})
            load.tune_reference = run_trial(engine, load.tune, None, concurrency=args.concurrency)
            load.eval_reference = run_trial(engine, load.evaluation, None, concurrency=args.concurrency)
            slos = slo_targets(load.tune_reference)

            def with_budget(budget_s: float, trace: Sequence[OnlineRequest]) -> dict[str, Any]:
                set_colocation(url, {"latency_budget_s": budget_s})
                return run_trial(engine, trace, lines, concurrency=args.concurrency)

            def at_rate(rate: float, trace: Sequence[OnlineRequest]) -> dict[str, Any]:
                set_colocation(url, {"latency_budget_s": None})
                return run_trial(engine, trace, lines, concurrency=args.concurrency, rate=rate)

            search = {"hygen": searched("hygen", lambda v: with_budget(v, load.tune), slos,
                                        args.low_budget_ms / 1000, args.high_budget_ms / 1000, args),
                      "hygen-star": searched("hygen-star", lambda v: at_rate(v, load.tune), slos, args.low_rate,
                                             args.high_rate, args)}
            runs = {"online-only": load.eval_reference,
                    "hygen": with_budget(search["hygen"]["value"], load.evaluation),
                    "hygen-star": at_rate(search["hygen-star"]["value"], load.evaluation)}
            cells[index] = {"runs": runs, "search": search}
        set_colocation(url, {"latency_budget_s": None})
    return cells, probe


def echo_runs(args: argparse.Namespace, loads: list[Load], lines: list[BatchLine], work: Path,
              cells: dict[int, dict[str, Any]]) -> None:
    """The Echo-mode server; its SLO settings move between replays (``k`` times the references)."""
    model = load_model(args.latency_model).to_dict()
    first = slo_scaled(1.0, loads[0].tune_reference)
    settings = PluginSettings(offline_policy="psm", psm_utility=args.utility,
                              colocation=ColocationConfig(mode="echo", latency_model=model, **first))
    with serving("echo", args, colocation_launch(settings, engine_args(args)), settings, work) as engine:
        for index, load in enumerate(loads):
            def at_scale(k: float, trace: Sequence[OnlineRequest]) -> dict[str, Any]:
                set_colocation(engine.server.base_url, slo_scaled(k, load.tune_reference))
                return run_trial(engine, trace, lines, concurrency=args.concurrency)

            search = searched("echo", lambda k: at_scale(k, load.tune), slo_targets(load.tune_reference),
                              args.low_echo_scale, args.high_scale, args)
            cells[index]["search"]["echo"] = search
            cells[index]["runs"]["echo"] = at_scale(search["value"], load.evaluation)


def priority_runs(args: argparse.Namespace, loads: list[Load], lines: list[BatchLine], work: Path,
                  cells: dict[int, dict[str, Any]]) -> None:
    """SGLang's own priority scheduling: offline rate searched, and the closed-loop reference."""
    sglang_args = [*engine_args(args), "--enable-priority-scheduling", "--schedule-policy", "fcfs"]
    with serving("priority", args, sglang_args, PluginSettings(offline_policy=OFF), work) as engine:
        for index, load in enumerate(loads):
            def at_rate(rate: float | None, trace: Sequence[OnlineRequest]) -> dict[str, Any]:
                return run_trial(engine, trace, lines, concurrency=args.concurrency, rate=rate, priority=True)

            search = searched(BASELINE, lambda v: at_rate(v, load.tune), slo_targets(load.tune_reference),
                              args.low_rate, args.high_rate, args)
            cells[index]["search"][BASELINE] = search
            cells[index]["runs"][BASELINE] = at_rate(search["value"], load.evaluation)
            cells[index]["runs"]["sglang-priority-unbounded"] = at_rate(None, load.evaluation)
            cells[index]["runs"]["sglang-priority-online-only"] = run_trial(engine, load.evaluation, None,
                                                                            concurrency=args.concurrency,
                                                                            priority=True)


def bros_runs(args: argparse.Namespace, loads: list[Load], lines: list[BatchLine], work: Path,
              cells: dict[int, dict[str, Any]]) -> None:
    """BROS mode reads its SLOs at start: one fresh server per ``k`` (per load), each stopped
    before the next starts."""
    model = load_model(args.latency_model, "bros").to_dict()
    for index, load in enumerate(loads):
        def at_scale(k: float, trace: Sequence[OnlineRequest]) -> dict[str, Any]:
            settings = PluginSettings(offline_policy=OFF, colocation=ColocationConfig(
                mode="bros", latency_model=model, **slo_scaled(k, load.tune_reference)))
            try:
                with serving(f"bros-{index}", args, colocation_launch(settings, engine_args(args)), settings,
                             work) as engine:
                    return run_trial(engine, trace, lines, concurrency=args.concurrency)
            except RuntimeError as error:  # the server did not start: a failed run, reported
                return {**{metric: math.inf for metric in METRICS}, "requests": len(trace), "completed": 0,
                        "errors": len(trace), "offline_tokens_per_s": 0.0, "utilisation": 0.0,
                        "failed": f"server start: {error}", "series": {"online": [], "offline_tokens": []}}

        search = searched("bros", lambda k: at_scale(k, load.tune), slo_targets(load.tune_reference),
                          args.low_bros_scale, args.high_scale, args)
        cells[index]["search"]["bros"] = search
        cells[index]["runs"]["bros"] = at_scale(search["value"], load.evaluation)


def judged(loads: list[Load], cells: dict[int, dict[str, Any]], tolerance: float) -> list[dict[str, Any]]:
    """Every evaluation run against its load's online-only reference on the same trace."""
    out = []
    for index, load in enumerate(loads):
        cell = cells[index]
        slos = slo_targets(load.eval_reference)
        for run in cell["runs"].values():
            run["slos_violated"] = violations(run, slos, tolerance)
            run["pool_exhausted"] = False
        out.append({"pattern": PATTERN, "rate_per_s": load.rate, "target_utilisation": load.target,
                    "online_requests": len(load.evaluation), "tune_reference": _without_series(load.tune_reference),
                    "search": cell["search"], "runs": {config: cell["runs"][config] for config in CONFIGS}})
    return out


def _without_series(run: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in run.items() if key != "series"}


def markdown(report: dict[str, Any]) -> str:
    lines = markdown_results(report, "offline output tok/s", "P99 TTFT and P99 TBT")
    probe = report["load_probe"]
    lines.append("")
    lines.append(f"Loads: online-only at {probe['probe_rate_per_s']:g} req/s kept the engine busy "
                 f"{probe['probe_utilisation']:.1%} of the time ({probe['engine_s_per_request'] * 1000:.0f} ms of "
                 "forward per request); rates for the target utilisations follow from that, and the table's "
                 "online-only rows show the utilisation each load really had.")
    lines.append("")
    lines += markdown_goal(report["targets"])
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    cells = report["cells"]
    fig, axes = latency_figure(len(cells))
    for column, cell in enumerate(cells):
        for config in CONFIGS:
            series = cell["runs"][config].get("series") or {"online": [], "offline_tokens": []}
            plot_online(axes, column, config, series["online"], marker_size=3)
            bins: dict[int, int] = {}
            for at, tokens in series["offline_tokens"]:
                bins[int(at // THROUGHPUT_BIN_S)] = bins.get(int(at // THROUGHPUT_BIN_S), 0) + tokens
            if bins:
                keys = sorted(bins)
                axes[2, column].step([k * THROUGHPUT_BIN_S for k in keys], [bins[k] / THROUGHPUT_BIN_S for k in keys],
                                     where="post", color=CONFIG_COLORS[config])
        label_column(axes, column, f"{cell['rate_per_s']:.3g} req/s online "
                     f"({cell['runs']['online-only']['utilisation']:.0%} busy online-only)",
                     "offline output tok/s", "seconds into the replay")
    save_figure(fig, axes, f"{report['model']}: online latency and offline throughput over time", path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--latency-model", type=Path, default=RESULTS / "latency-model.json")
    parser.add_argument("--targets", default="0.25,0.4,0.55", help="online-only engine utilisations, one load each")
    parser.add_argument("--probe-rate", type=float, default=0.5, help="online req/s of the load probe")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of online trace per replay")
    parser.add_argument("--tolerance", type=float, default=0.25)
    parser.add_argument("--resolution", type=float, default=5.0,
                        help="every search bisects until its bracket's high/low ratio is at most this")
    parser.add_argument("--low-budget-ms", type=float, default=20.0)
    parser.add_argument("--high-budget-ms", type=float, default=400.0)
    add_deadline_scale_arguments(parser)
    parser.add_argument("--low-rate", type=float, default=0.05, help="searched offline requests per second, lowest")
    parser.add_argument("--high-rate", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64, help="offline requests in flight at most")
    parser.add_argument("--utility", type=float, default=0.9, help="PSM utility u for the offline order")
    parser.add_argument("--kv-tokens", type=int, default=16384)
    parser.add_argument("--chunk", type=int, default=512,
                        help="SGLang --chunked-prefill-size for every server (Sarathi-style chunks, as in HyGen)")
    parser.add_argument("--offline-n", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: one load (40%%), 15 s traces, no bisection")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default bench/results/colocation.json; with --quick, a temp dir)")
    args = parser.parse_args(argv)
    args.targets = [float(target) for target in args.targets.split(",")]
    if args.quick:
        args.targets, args.duration, args.resolution = [0.4], 15.0, 1000.0
    if args.out is None:
        args.out = Path(tempfile.gettempdir()) / "colocation-quick.json" if args.quick else RESULTS / "colocation.json"
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    work = args.out.parent / f"{args.out.stem}-work"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    prompts = sharegpt_prompts(400, args.seed, max_chars=600, max_tokens_cap=48)
    lines = offline_lines(args.offline_n, args.seed)
    loads: list[Load] = []
    cells, probe = colocation_runs(args, loads, prompts, lines, work)
    echo_runs(args, loads, lines, work, cells)
    priority_runs(args, loads, lines, work, cells)
    bros_runs(args, loads, lines, work, cells)
    report = {"model": args.model, "duration_s": args.duration, "tolerance": args.tolerance,
              "kv_tokens": args.kv_tokens, "chunk": args.chunk, "concurrency": args.concurrency,
              "offline_lines": len(lines), "search_resolution": args.resolution,
              "latency_model": str(args.latency_model), "load_probe": probe,
              "cells": judged(loads, cells, args.tolerance)}
    report["table"] = table(report["cells"])
    report["targets"] = targets(report["cells"])
    report["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report) + "\n")
    plot(report, args.out.with_suffix(".png"))
    print(markdown(report))
    print(f"wall time {report['wall_s']} s -> {args.out}")


if __name__ == "__main__":
    main()
