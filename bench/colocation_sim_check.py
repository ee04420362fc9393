"""The co-location simulator against the emulated H100: every configuration of a
`bench.colocation_emulated` report simulated at the knob it was evaluated with, on the same online
traces (seeds, rates, ShareGPT prompts tokenised by the served tokenizer, reply lengths) and the
same offline batch, with the emulated engine's limits (KV pool, chunked prefill, running requests,
mixed chunks for the co-location modes, none for SGLang's priority scheduling).

Both price a forward with the same `StepTime` (`emulation.pricing`), so where they differ the
difference is what the simulator leaves out: above all the host. The emulated engine's iterations
last from one batch's end to the next's (`core.host_gap.end_to_end`), the simulator's their price.
Each configuration is simulated three times:

- ``gpu_host``: as a GPU server's engine (an iteration lasts its price);
- ``this_host``: with this host (`sim.host`: an iteration lasts its price or a host gap drawn from
  those the emulated run measured for batches of its size, as the pacer runs it), the gaps taken
  from the iteration records of the same configuration's evaluation replays (the report's work
  folder): it checks everything but the host -- the scheduling, batching and queueing -- against
  SGLang's;
- ``tuning_seed``: with the host gaps and the front end (`sim.front_end`: an online request's way
  to the scheduler and its first token's way back) that `bench.front_end` measured on the tuning
  seed, where the configuration ran at the same knob: a prediction for the evaluation seeds from
  nothing measured on them. The measured way to the scheduler ends when the scheduler's loop takes
  the request, so it holds the wait for the iteration under way, which the simulated engine adds
  again: up to one iteration (a few milliseconds) counted twice.

Each simulated replay starts where the emulated one did: the judge's trial starts its offline
batch (validation, its first answers, a warm-up) some 20-30 s before the first online request,
so the lines in flight are no longer the file's first ones. The simulated batch starts that lead
(`offline_lead_s`, read from the records) before the trace, and its tokens count from the trace's
start.

The report gives, per configuration and load, the emulated figure (mean over its seeds), the
simulated ones and their differences, flagging those over 10%.

Offline throughput is output tokens on both sides: the judge counts the batch's committed output
tokens (its usage), so the simulator's figure is its offline output tokens alone
(`ColocatedResult.offline_output_tokens_per_s`), not prompts and outputs.

Three figures split what the client sees into the engine's part and the rest, from the emulated
run's iteration records in each replay's window:

- ``engine_offline_tokens_per_s``: the offline tokens the engine decoded (``offline_decode``,
  one token per offline request per batch; a prompt's first token, one per line, is left out).
  The Batch API commits a line's tokens when the line ends, so lines still running or parked when
  the replay ends have decoded tokens it has not counted yet.
- ``scheduler_ttft_p99``: P99 of each online request's time from the scheduler's receipt to the
  end of the batch that completed its prompt (`scheduler_ttfts`), the scheduler's part of a time
  to first token. The simulator's counterpart is its engine's time from taking a request in to
  its first token (``RequestTiming.received``); what the client's P99 adds beyond it is the front
  end (HTTP, tokenizer manager and detokenizer, the client).
- ``engine_tbt_p99``: per online token decoded, the time from the batch before's end to its
  batch's (`engine_token_gaps`): the time between a request's tokens before the way back to the
  client, which the simulated TBT is.

Each mode's knob search is also run in the simulator on the tuning trace, with and without the
host, beside the knob the emulated search chose: what ``--sim-first`` in the judge starts from.

The priority baseline's and HyGen*'s knob on the emulated engine is the Batch API's offline
concurrency (``--batch-max-inflight``), which the simulator has no counterpart for (it releases
offline work at a rate); they are reported, not simulated.

    python -m bench.colocation_sim_check --report bench/results/colocation_emulated.json
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import functools
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.colocation import online_trace, sharegpt_prompts
from bench.colocation_emulated import (
    BASELINE,
    BASELINE_AT_SLO,
    BASELINE_FLOOR,
    BROS_AT_SLO,
    DEVICE,
    IDLE_QUIET_S,
    MODEL,
    RUNS_AS,
    TUNE_SEED,
    decoded_tokens_per_s,
    echo_scale_range,
    evaluation_seeds,
    in_replay,
    latency_fit,
    parse_args,
    record_file,
    search,
    slo_for,
    slo_scaled,
    work_folder,
)
from bench.shipped_path import HARDWARE
from sgl_blend.core.bros.cost import IterationCost, PeriodTail, SwapModel
from sgl_blend.core.host_gap import HostTime
from sgl_blend.core.bros.requests import SLO as RealtimeSLO
from sgl_blend.core.colocation import ColocationConfig, ColocationController
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.host_gap import end_to_end
from sgl_blend.core.latency_model import FitReport, LatencyModel
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.core.request_timing import RequestTiming
from sgl_blend.emulation.launch import emulated_launch
from sgl_blend.emulation.memory import EngineSizing
from sgl_blend.emulation.pricing import ForwardPricer
from sgl_blend.forward_time.step_time import IterationClock, NoisyClock, StepTime
from sgl_blend.measure.latency_profile import read_records
from sgl_blend.measure.online_replay import OnlineRequest, summarize
from sgl_blend.models.registry import STAND_IN, prepare
from sgl_blend.sim.bros_colocation import ClockDevice, run_bros
from sgl_blend.sim.bros_device import H100_H2D_SAMPLES
from sgl_blend.sim.bros_engine import SimSettings
from sgl_blend.sim.colocation import ColocatedConfig, ColocatedEngine, OnlineArrival
from sgl_blend.sim.front_end import FrontEnd
from sgl_blend.sim.host import HostBoundClock, HostGaps
from sgl_blend.sim.workload import SimRequest
from sgl_blend.workloads.paper_lines import paper_requests

RESULTS = Path(__file__).parent / "results"
# What the client measures (the judge's report), and what the iteration records say of the engine.
CLIENT_METRICS = ("ttft_p99", "tbt_p99", "offline_tokens_per_s")
ENGINE_METRICS = ("engine_offline_tokens_per_s", "scheduler_ttft_p99", "engine_tbt_p99")
COMPARED = CLIENT_METRICS + ENGINE_METRICS
# The simulations of a row, as the report names them: no host, this host's gaps from the evaluation
# replays, and host and front end measured on the tuning seed.
SIMULATIONS = ("gpu_host", "this_host", "tuning_seed")
FLAG = 0.10
# The front end's draws: one stream, so every simulated run of a row draws the same delays.
FRONT_END_SEED = 0
# Configurations whose knob is the Batch API's offline concurrency: no counterpart in the simulator.
BY_CONCURRENCY = (BASELINE, BASELINE_FLOOR, "hygen-star", BASELINE_AT_SLO)


def as_arrivals(trace: Sequence[OnlineRequest], tokenizer: Any) -> list[OnlineArrival]:
    """An emulated replay's trace as the simulator's requests, prompts tokenised by the served
    tokenizer."""
    lengths = tokenizer([request.prompt for request in trace])["input_ids"]
    return [
        OnlineArrival(
            request.t,
            SimRequest(f"online-{index}", "online", (), len(ids), request.max_tokens, request.max_tokens, True),
        )
        for index, (request, ids) in enumerate(zip(trace, lengths))
    ]


def online_arrivals(
    report: dict[str, Any], rate: float, seed: int, tokenizer: Any, requests: int | None = None
) -> list[OnlineArrival]:
    """The emulated bench's trace for ``rate`` and ``seed`` (``requests`` long, the evaluation
    traces' length by default), as the simulator's requests."""
    prompts = sharegpt_prompts(
        report.get("prompts", 2000),
        report.get("seed", 0),
        max_chars=report.get("max_prompt_chars", 4000),
        max_tokens_cap=report["max_output"],
    )
    duration = (requests or report["requests"]) / rate
    return as_arrivals(online_trace("poisson", rate, duration, duration, prompts, seed), tokenizer)


def has_offline(record: dict[str, Any]) -> bool:
    return bool(record["offline_prefill"] or record["offline_decode"])


def host_gaps(config: str, records: list[dict[str, Any]], runs: list[dict[str, Any]]) -> HostGaps:
    """The host gaps measured during ``runs``' replays; for a co-location mode, only after
    iterations that carried offline work, the regime it runs in."""

    def keep(record: dict[str, Any]) -> bool:
        return any(in_replay(record, run) for run in runs) and (config == "online-only" or has_offline(record))

    return HostGaps.measure(records, keep)


def engine_token_gaps(records: Sequence[dict[str, Any]]) -> list[float]:
    """Per online token a batch decoded, the time from the previous batch's end to this one's
    (`core.host_gap.end_to_end`): the engine's time between an online request's tokens (an
    online decode is never parked, so it ran in the batch before too), without the way to the
    client. Not the batch's launch-to-launch period, which is the batch before's."""
    return [
        gap
        for previous, record in zip(records, records[1:])
        if (gap := end_to_end(previous, record)) is not None
        for _ in range(record["online_decode"])
    ]


def scheduler_ttfts(records: Sequence[dict[str, Any]]) -> list[float]:
    """Per online request whose prompt a batch of ``records`` completed (``online_prefilled``),
    seconds from the scheduler's receipt to that batch's end: its first token, on the scheduler."""
    return [record["wall"] - received for record in records for received in record.get("online_prefilled", ())]


def offline_lead_s(records: Sequence[dict[str, Any]], run: dict[str, Any]) -> float:
    """Seconds the engine ran ``run``'s offline batch before its replay started (`OfflineBatch.start`
    waits for validation, the first answers and a warm-up): from the first iteration after the
    engine's last idle spell (`trial` waits for one before it creates the batch) to the replay's
    start; 0 when that spell lasted into the replay (a batch that had answered nothing when the
    replay began). Its lines in flight then are no longer the file's first ones: the long ones stay."""
    walls = sorted(record["wall"] for record in records)
    upto = walls[: bisect.bisect_left(walls, run["started_wall"]) + 1]  # and the first one after the start
    if not upto:
        return 0.0
    starts = [later for earlier, later in zip(upto, upto[1:]) if later - earlier > IDLE_QUIET_S]
    return max(run["started_wall"] - (starts[-1] if starts else upto[0]), 0.0)


def engine_figures(records: Sequence[dict[str, Any]], run: dict[str, Any], requests: int) -> dict[str, float]:
    """The engine's figures of one replay (``run``) from its server's iteration ``records``, those in
    the replay's window. Raises when they hold other than the replay's ``requests`` first tokens."""
    window = [record for record in records if in_replay(record, run)]
    first_tokens = scheduler_ttfts(window)
    if len(first_tokens) != requests:
        raise ValueError(f"the replay's records hold {len(first_tokens)} first tokens, it sent {requests} requests")
    return {
        "engine_offline_tokens_per_s": decoded_tokens_per_s(window, run),
        "scheduler_ttft_p99": float(np.percentile(first_tokens, 99)),
        "engine_tbt_p99": float(np.percentile(engine_token_gaps(window), 99)),
    }


def emulated_figures(
    runs: list[dict[str, Any]], records: list[dict[str, Any]], traces: list[Sequence[OnlineArrival]]
) -> list[dict[str, float]]:
    """Per evaluation run (replayed from its trace): the client's figures, as the judge reported
    them, and the engine's, from the server's iteration ``records`` in the replay's window."""
    return [
        {
            **{metric: run[metric] for metric in CLIENT_METRICS},
            **engine_figures(records, run, len(trace)),
        }
        for run, trace in zip(runs, traces, strict=True)
    ]


def figures(
    online: Sequence[RequestTiming], offline_tokens_per_s: float, front: FrontEnd | None = None
) -> dict[str, Any]:
    """A simulated run's figures, under the names of the emulated ones they are compared with: its
    offline tokens and its TBT are the engine's (the front end moves first tokens only), its TTFT
    from receipt the scheduler's; the client's TTFT crosses the front end when ``front`` is given."""
    from_receipt = [
        timing.ttft - timing.received for timing in online if timing.ttft is not None and timing.received is not None
    ]
    summarized = summarize(online if front is None else front.add_to(online, FRONT_END_SEED))
    return {
        **summarized,
        "offline_tokens_per_s": offline_tokens_per_s,
        "engine_offline_tokens_per_s": offline_tokens_per_s,
        "scheduler_ttft_p99": float(np.percentile(from_receipt, 99)),
        "engine_tbt_p99": summarized["tbt_p99"],
    }


@dataclasses.dataclass(frozen=True)
class Simulator:
    """The judge's engine in the simulator: the emulated device's price, the latency models the
    modes plan with, the emulated engine's limits and the judge's offline batch, each line asking
    for exactly its output (`paper_lines`: ``max_tokens``, ``ignore_eos``)."""

    step: StepTime
    latency_model: dict[str, Any]
    bros_model: LatencyModel
    swap: SwapModel
    sizing: EngineSizing
    cost: CostModel
    offline: list[SimRequest]
    tokenizer: Any
    args: argparse.Namespace

    @classmethod
    def of(cls, args: argparse.Namespace, pricer: ForwardPricer, fit: FitReport) -> Simulator:
        """For the judge's arguments (`colocation_emulated.parse_args`: its batch, seed and knob
        ranges) and its latency fit (`colocation_emulated.latency_fit`)."""
        from transformers import AutoTokenizer

        sizing = emulated_launch(DEVICE, MODEL).sizing
        assert sizing is not None, "the emulated device has a sizing"
        cost = CostModel(model_spec(MODEL), HardwareSpec.resolve(HARDWARE))
        offline = [
            dataclasses.replace(request, max_new_tokens=request.output_len, exact=True)
            for request in paper_requests(args.offline_trace, args.offline_lines, cost, args.seed)
        ]
        return cls(
            pricer.step,
            fit.models[fit.best_form()].to_dict(),
            fit.models["bros"],
            SwapModel.fit(H100_H2D_SAMPLES, cost.model.kv_bytes_per_token),
            sizing,
            cost,
            offline,
            AutoTokenizer.from_pretrained(str(prepare(STAND_IN)[0])),
            args,
        )

    @classmethod
    def for_report(cls, report: dict[str, Any]) -> Simulator:
        """For the batch, seed and knob ranges a `bench.colocation_emulated` report ran with."""
        tail = report.get("bros_tail_quantile")
        args = parse_args(
            ["--seed", str(report.get("seed", 0)), "--offline-trace", report["offline_trace"]]
            + ["--offline-lines", str(report["offline_lines"])]
            + ([] if tail is None else ["--bros-tail-quantile", str(tail)])
            + (["--bros-radix-cache"] if report.get("bros_radix_cache") else [])
            + ["--low-bros-at-slo-scale", str(report.get("bros_at_slo_low_scale", 1.0))]
        )
        return cls.of(args, *latency_fit(args))

    def arrivals(self, trace: Sequence[OnlineRequest]) -> list[OnlineArrival]:
        return as_arrivals(trace, self.tokenizer)

    def run(
        self,
        config: str,
        value: float | None,
        targets: dict[str, float],
        arrivals: Sequence[OnlineArrival],
        host: HostGaps | None = None,
        front: FrontEnd | None = None,
        lead_s: float = 0.0,
    ) -> dict[str, Any]:
        """One configuration at knob ``value`` on ``arrivals`` (``targets``: the load's, which
        Echo's and BROS's k scale); with ``host``, iterations wait for the host as the emulated
        engine's do; with ``front``, first tokens reach the client across its front end. The
        offline batch starts ``lead_s`` before the first arrival (`offline_lead_s`), and its
        tokens count from there."""
        sizing = self.sizing
        arrivals = [dataclasses.replace(arrival, at=arrival.at + lead_s) for arrival in arrivals]
        device: IterationClock = NoisyClock(self.step, 0.0, 0)
        horizon = max(arrival.at for arrival in arrivals)
        if config == "bros":
            # BROS's plan learns the host's time from the gaps, as the plugin learns it from records.
            host_time = HostTime()
            clock = device if host is None else HostBoundClock(device, host, observer=host_time.observe)
            assert value is not None
            scaled = slo_scaled(value, targets)
            slo = RealtimeSLO(scaled["ttft_slo_s"], scaled["tpot_slo_s"], scaled["idle_budget_s"])
            settings = SimSettings(
                kv_tokens=sizing.max_total_tokens,
                max_running=sizing.max_running_requests,
                prefill_token_budget=sizing.chunked_prefill_size,
                be_concurrency=sizing.max_running_requests,
                slo=slo,
            )
            # and plans to the tail of its periods when the judged engine's did
            tail = None if self.args.bros_tail_quantile is None else PeriodTail(self.args.bros_tail_quantile)
            cost = IterationCost(self.bros_model, self.swap, host_time, tail)
            result = run_bros(
                arrivals,
                self.offline,
                ClockDevice(clock, self.swap),
                cost,
                settings,
                horizon,
                radix_cache=self.args.bros_radix_cache,
            )
            return figures(result.online, result.offline_output_tokens_per_s(lead_s), front)
        if config == "echo":
            assert value is not None
            colocation = ColocationConfig(mode="echo", latency_model=self.latency_model, **slo_scaled(value, targets))
        else:
            budget = value if config == "hygen" else None
            colocation = ColocationConfig(mode="hygen", latency_model=self.latency_model, latency_budget_s=budget)
        engine_config = ColocatedConfig(
            sizing.max_total_tokens,
            chunk_tokens=sizing.chunked_prefill_size,
            max_running=sizing.max_running_requests,
            batch_window=True,
        )
        policy = make_offline_policy("psm", self.cost.model, self.cost.hardware) if config != "online-only" else None
        controller = ColocationController(colocation)
        # and so does HyGen's or Echo's
        clock = device if host is None else HostBoundClock(device, host, observer=controller.observe_host)
        engine = ColocatedEngine(clock, controller, policy, engine_config)
        result = engine.run(arrivals, self.offline if policy is not None else [], horizon)
        return figures(result.online, result.offline_output_tokens_per_s(lead_s), front)

    def tune(
        self,
        config: str,
        label: str,
        targets: dict[str, float],
        tolerance: float,
        arrivals: Sequence[OnlineArrival],
        host: HostGaps | None = None,
    ) -> dict[str, Any]:
        """The judge's knob search for ``config`` (its range and resolution) run in the simulator on
        ``arrivals``, against ``targets`` within ``tolerance``: the knob the simulator chooses."""
        low, high = knob_range(self.args, config, targets)
        mode = RUNS_AS.get(config, config)
        found = search(
            f"sim {label}",
            lambda value: self.run(mode, value, targets, arrivals, host),
            targets,
            tolerance,
            low,
            high,
            self.args.resolution,
        )
        return {"value": found["value"], "met": found["met"], "tried": [trial["value"] for trial in found["trials"]]}


def versus(emulated: list[dict[str, float]], sims: list[dict[str, Any]]) -> dict[str, Any]:
    """The simulated figures (mean over seeds) beside the emulated ones (per seed), and where they
    differ: by more than 10% of the emulated mean, and outside the range of the emulated seeds
    (this host's own seed-to-seed spread, as wide as the difference on some metrics)."""
    mean = {metric: statistics.fmean(run[metric] for run in emulated) for metric in COMPARED}
    simulated = {metric: statistics.fmean(sim[metric] for sim in sims) for metric in COMPARED}
    difference = differences(mean, simulated, COMPARED)
    outside = [
        metric
        for metric in COMPARED
        if not min(run[metric] for run in emulated) <= simulated[metric] <= max(run[metric] for run in emulated)
    ]
    return {
        "simulated": simulated,
        "difference": difference,
        "over_10_percent": over_flag(difference),
        "outside_seed_range": outside,
    }


def differences(
    emulated: dict[str, float], simulated: dict[str, float], metrics: Sequence[str]
) -> dict[str, float | None]:
    """Per metric, the simulated figure's difference from the emulated one, as a fraction of it
    (None where the emulated figure is 0)."""
    return {
        metric: (simulated[metric] - emulated[metric]) / emulated[metric] if emulated[metric] else None
        for metric in metrics
    }


def over_flag(difference: dict[str, float | None]) -> list[str]:
    """The metrics whose difference is over `FLAG`."""
    return [metric for metric, diff in difference.items() if diff is not None and abs(diff) > FLAG]


@functools.cache
def iteration_log(path: Path) -> list[dict[str, Any]]:
    """An iteration log, read once: online-only and HyGen share theirs at every load."""
    return list(read_records(path))


def knob_range(args: argparse.Namespace, config: str, targets: dict[str, float]) -> tuple[float, float]:
    """The judge's search range for ``config``'s knob at a load with these ``targets``."""
    if config == "hygen":
        return args.low_budget_ms / 1000, args.high_budget_ms / 1000
    if config == BROS_AT_SLO:
        return args.low_bros_at_slo_scale, 1.0
    if config == "echo":
        lowest, high = echo_scale_range(args)
        return (lowest(targets) if callable(lowest) else lowest), high
    return args.low_bros_scale, args.high_scale


def compare(
    report: dict[str, Any], work: Path, configs: set[str] | None = None, probe: Path | None = None
) -> dict[str, Any]:
    simulator = Simulator.for_report(report)
    probed: dict[tuple[float, str], dict[str, Any]] = {}
    if probe is not None:
        probed = {(row["share"], row["config"]): row for row in json.loads(probe.read_text())["rows"]}
        probe_work = work_folder(probe)
    rows = []
    for cell in report["cells"]:
        seeds = list(evaluation_seeds(report))
        rate = cell["rate_per_s"]
        arrivals = {seed: online_arrivals(report, rate, seed, simulator.tokenizer) for seed in seeds}
        tuning = online_arrivals(report, rate, TUNE_SEED, simulator.tokenizer, report["tune_requests"])
        for config, runs in cell["runs"].items():
            if configs is not None and config not in configs:
                continue
            searched = cell["search"].get(config)
            # BROS at the absolute SLO is the simulator's BROS with its deadlines scaled from that SLO
            mode = RUNS_AS.get(config, config)
            targets, tolerance = slo_for(config, report["capacity_slo_s"], cell["targets_s"], cell["tolerance"])
            has_search = searched is not None and bool(searched["trials"])  # one value: no search
            value = searched["value"] if searched else None
            records = iteration_log(work / record_file(config, cell["share"], value))
            per_seed = emulated_figures(runs, records, [arrivals[seed] for seed in seeds])
            row: dict[str, Any] = {
                "share": cell["share"],
                "rate_per_s": rate,
                "config": config,
                "emulated": {metric: statistics.fmean(run[metric] for run in per_seed) for metric in COMPARED},
                "emulated_seeds": per_seed,
                "host_late_share": statistics.fmean(run.get("host_late_share", 0.0) for run in runs),
            }
            if config in BY_CONCURRENCY:
                row["why"] = "offline concurrency has no counterpart in the simulator"
                rows.append(row)
                continue
            host = host_gaps(mode, records, runs)
            row["host_gaps"] = host.summary()
            leads = [offline_lead_s(records, run) if mode != "online-only" else 0.0 for run in runs]
            row["offline_lead_s"] = [round(lead, 1) for lead in leads]
            for key, with_host in (("gpu_host", None), ("this_host", host)):
                sims = [
                    simulator.run(mode, value, targets, arrivals[seed], with_host, lead_s=lead)
                    for seed, lead in zip(seeds, leads)
                ]
                row[key] = versus(per_seed, sims)
                if has_search:
                    label = f"{config} {cell['share']:g} tuning{' with host' if with_host else ''}"
                    row[key]["tuned"] = simulator.tune(config, label, targets, tolerance, tuning, with_host)
            measured = probed.get((cell["share"], config))
            if measured is not None:
                # host and front end from the probe on the tuning seed: neither seen on these seeds
                probe_records = iteration_log(probe_work / measured["records"])
                front = FrontEnd(tuple((to, back) for to, back in measured["delays_s"]))
                tuned_host = host_gaps(mode, probe_records, [measured])
                sims = [
                    simulator.run(mode, value, targets, arrivals[seed], tuned_host, front, lead)
                    for seed, lead in zip(seeds, leads)
                ]
                row["tuning_seed"] = {**versus(per_seed, sims), "front_end": front.summary()}
            if has_search:
                row["tuned"] = {
                    "value": searched["value"],
                    "met": searched["met"],
                    "tried": [trial["value"] for trial in searched["trials"]],
                }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"report": report.get("source"), "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "Each figure: emulated / sim / sim with host (gaps of the evaluation replays) / sim with host "
        "and front end (both measured on the tuning seed, `bench.front_end`).",
        "",
        "| load | config | P99 TTFT ms | scheduler's P99 TTFT ms | P99 TBT ms | engine's P99 TBT ms "
        "| offline tok/s committed | offline tok/s decoded | host late "
        "| last sim: over 10%; outside the emulated seeds' range |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:

        def shown(metric: str, scale: float, digits: int, row: dict[str, Any] = row) -> str:
            values = [row["emulated"].get(metric)] + [
                row[key]["simulated"][metric] if key in row else None for key in SIMULATIONS
            ]
            return " / ".join("-" if value is None else f"{value * scale:.{digits}f}" for value in values)

        over = row.get("why")
        if over is None:
            last = next(row[key] for key in reversed(SIMULATIONS) if key in row)
            over = (
                f"{', '.join(last['over_10_percent']) or 'none'}; "
                f"outside the seeds: {', '.join(last['outside_seed_range']) or 'none'}"
            )
        lines.append(
            f"| {row['share']:.0%} | {row['config']} | {shown('ttft_p99', 1000, 0)} | "
            f"{shown('scheduler_ttft_p99', 1000, 1)} | {shown('tbt_p99', 1000, 1)} | "
            f"{shown('engine_tbt_p99', 1000, 1)} | "
            f"{shown('offline_tokens_per_s', 1, 0)} | {shown('engine_offline_tokens_per_s', 1, 0)} | "
            f"{row['host_late_share']:.1%} | {over} |"
        )
    lines += [
        "",
        "| load | config | knob chosen on the tuning seed (emulated / sim / sim with host) | tried |",
        "|---|---|---|---|",
    ]
    for row in result["rows"]:
        if "tuned" not in row:
            continue
        tunings = [row["tuned"], row["gpu_host"]["tuned"], row["this_host"]["tuned"]]

        def chosen(tuned: dict[str, Any]) -> str:
            return f"{tuned['value']:.4g}{'' if tuned['met'] else ' (not met)'}"

        tried = " / ".join(", ".join(f"{value:.4g}" for value in tuned["tried"]) for tuned in tunings)
        lines.append(
            f"| {row['share']:.0%} | {row['config']} | {' / '.join(chosen(tuned) for tuned in tunings)} | {tried} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=RESULTS / "colocation_emulated.json")
    parser.add_argument(
        "--work", type=Path, help="the report's work folder, with its iteration records (default: beside the report)"
    )
    parser.add_argument("--configs", help="comma-separated configurations to check (default: all)")
    parser.add_argument(
        "--front-end",
        type=Path,
        default=RESULTS / "front_end.json",
        help="`bench.front_end`'s measurement on the tuning seed (skipped when it or its records are absent)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "colocation_sim_check.json")
    args = parser.parse_args(argv)
    report = {**json.loads(args.report.read_text()), "source": str(args.report)}
    work = args.work or work_folder(args.report)
    probe = args.front_end if work_folder(args.front_end).is_dir() else None
    if probe is None:
        print(f"no front-end probe with its records at {args.front_end}: no tuning-seed column", flush=True)
    result = compare(report, work, set(args.configs.split(",")) if args.configs else None, probe)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
