"""The co-location simulator against the emulated H100: every configuration of a
`bench.colocation_emulated` report simulated at the knob it was evaluated with, on the same online
traces (seeds, rates, ShareGPT prompts tokenised by the served tokenizer, reply lengths) and the
same offline batch, with the emulated engine's limits (KV pool, chunked prefill, running requests,
mixed chunks for the co-location modes, none for SGLang's priority scheduling).

Both price a forward with the same `StepTime` (`emulation.pricing`), so where they differ the
difference is what the simulator leaves out: above all the host. The emulated engine's iterations
take their launch-to-launch period (`iteration_log`'s ``period_s``), the simulator's their price.
Each configuration is simulated twice: as a GPU server's engine (an iteration lasts its price)
and with this host (`sim.host`: an iteration lasts its price or a host gap drawn from those the
emulated run measured for batches of its size, as the pacer runs it). The gaps come from the
iteration records of the same configuration's evaluation replays (the report's work folder), so
the second simulation checks everything but the host -- the scheduling, batching and queueing --
against SGLang's. The report
gives, per configuration and load, the emulated figure (mean over its seeds), both simulated ones
and their differences, flagging those over 10%.

Offline throughput is output tokens on both sides: the judge counts the batch's committed output
tokens (its usage), so the simulator's figure is its offline output tokens alone
(`ColocatedResult.offline_output_tokens_per_s`), not prompts and outputs.

The priority baseline's and HyGen*'s knob on the emulated engine is the Batch API's offline
concurrency (``--batch-max-inflight``), which the simulator has no counterpart for (it releases
offline work at a rate); they are reported, not simulated.

    python -m bench.colocation_sim_check --report bench/results/colocation_emulated.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.colocation import online_trace, sharegpt_prompts
from bench.colocation_emulated import BASELINE, DEVICE, FIRST_EVAL_SEED, MODEL, latency_fit, parse_args, slo_scaled
from bench.shipped_path import HARDWARE
from sgl_blend.core.bros.cost import IterationCost, SwapModel
from sgl_blend.core.bros.requests import SLO as RealtimeSLO
from sgl_blend.core.colocation import ColocationConfig, ColocationController
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.emulation.launch import emulated_launch
from sgl_blend.forward_time.step_time import IterationClock, NoisyClock
from sgl_blend.measure.online_replay import summarize
from sgl_blend.models.registry import STAND_IN, prepare
from sgl_blend.sim.bros_colocation import ClockDevice, run_bros
from sgl_blend.sim.bros_device import H100_H2D_SAMPLES
from sgl_blend.sim.bros_engine import SimSettings
from sgl_blend.sim.colocation import ColocatedConfig, ColocatedEngine, OnlineArrival
from sgl_blend.sim.host import HostBoundClock, HostGaps, read_records
from sgl_blend.sim.workload import SimRequest
from sgl_blend.workloads.paper_lines import paper_requests

RESULTS = Path(__file__).parent / "results"
COMPARED = ("ttft_p99", "tbt_p99", "offline_tokens_per_s")
FLAG = 0.10
# Configurations whose knob is the Batch API's offline concurrency: no counterpart in the simulator.
BY_CONCURRENCY = (BASELINE, "hygen-star")


def online_arrivals(report: dict[str, Any], rate: float, seed: int, tokenizer: Any) -> list[OnlineArrival]:
    """The emulated bench's trace for ``rate`` and ``seed``, as the simulator's requests."""
    prompts = sharegpt_prompts(
        report.get("prompts", 2000),
        report.get("seed", 0),
        max_chars=report.get("max_prompt_chars", 4000),
        max_tokens_cap=report["max_output"],
    )
    duration = report["requests"] / rate
    trace = online_trace("poisson", rate, duration, duration, prompts, seed)
    lengths = tokenizer([request.prompt for request in trace])["input_ids"]
    return [
        OnlineArrival(
            request.t,
            SimRequest(f"online-{index}", "online", (), len(ids), request.max_tokens, request.max_tokens, True),
        )
        for index, (request, ids) in enumerate(zip(trace, lengths))
    ]


def has_offline(record: dict[str, Any]) -> bool:
    return bool(record["offline_prefill"] or record["offline_decode"])


def record_file(config: str, share: float, value: float | None) -> str:
    """The iteration log of the server ``config``'s evaluation ran on (`colocation_emulated.serving`):
    online-only's and HyGen's first server, Echo's own, one per load and knob for BROS."""
    if config == "online-only":
        return "hygen.records.jsonl"
    return f"bros-{share:g}-{value:.4g}.records.jsonl" if config == "bros" else f"{config}.records.jsonl"


def host_gaps(work: Path, config: str, share: float, value: float | None, runs: list[dict[str, Any]]) -> HostGaps:
    """The host gaps measured during ``runs``' replays (``started_wall`` for ``window_s``); for a
    co-location mode, only after iterations that carried offline work, the regime it runs in."""
    windows = [(run["started_wall"], run["started_wall"] + run["window_s"]) for run in runs]

    def keep(record: dict[str, Any]) -> bool:
        inside = any(start <= record["wall"] <= end for start, end in windows)
        return inside and (config == "online-only" or has_offline(record))

    return HostGaps.measure(read_records(work / record_file(config, share, value)), keep)


def simulate(
    config: str,
    value: float | None,
    cell: dict[str, Any],
    arrivals: Sequence[OnlineArrival],
    offline: list[SimRequest],
    setup: dict[str, Any],
    host: HostGaps | None = None,
) -> dict[str, Any]:
    """One configuration at its evaluated knob on one seed's arrivals; with ``host``, iterations
    wait for the host as the emulated engine's do."""
    sizing = setup["sizing"]
    clock: IterationClock = NoisyClock(setup["step"], 0.0, 0)
    if host is not None:
        clock = HostBoundClock(clock, host)
    horizon = max(arrival.at for arrival in arrivals)
    if config == "bros":
        assert value is not None
        scaled = slo_scaled(value, cell["targets_s"])
        slo = RealtimeSLO(scaled["ttft_slo_s"], scaled["tpot_slo_s"], scaled["idle_budget_s"])
        settings = SimSettings(
            kv_tokens=sizing.max_total_tokens,
            max_running=sizing.max_running_requests,
            prefill_token_budget=sizing.chunked_prefill_size,
            be_concurrency=sizing.max_running_requests,
            slo=slo,
        )
        device = ClockDevice(clock, setup["swap"])
        result = run_bros(
            arrivals, offline, device, IterationCost(setup["bros_model"], setup["swap"]), settings, horizon
        )
        return {**summarize(result.online), "offline_tokens_per_s": result.offline_output_tokens_per_s()}
    latency_model = setup["latency_model"]
    if config == "echo":
        assert value is not None
        colocation = ColocationConfig(mode="echo", latency_model=latency_model, **slo_scaled(value, cell["targets_s"]))
    else:
        colocation = ColocationConfig(
            mode="hygen", latency_model=latency_model, latency_budget_s=value if config == "hygen" else None
        )
    engine_config = ColocatedConfig(
        sizing.max_total_tokens,
        chunk_tokens=sizing.chunked_prefill_size,
        max_running=sizing.max_running_requests,
        batch_window=True,
    )
    cost: CostModel = setup["cost"]
    policy = make_offline_policy("psm", cost.model, cost.hardware) if config != "online-only" else None
    engine = ColocatedEngine(clock, ColocationController(colocation), policy, engine_config)
    result = engine.run(arrivals, offline if policy is not None else [], horizon)
    return {**summarize(result.online), "offline_tokens_per_s": result.offline_output_tokens_per_s()}


def versus(emulated: dict[str, float], sims: list[dict[str, Any]]) -> dict[str, Any]:
    """The simulated figures (mean over seeds) beside the emulated ones, and where they differ."""
    simulated = {metric: statistics.fmean(sim[metric] for sim in sims) for metric in COMPARED}
    difference = {
        metric: (simulated[metric] - emulated[metric]) / emulated[metric] if emulated[metric] else None
        for metric in COMPARED
    }
    over = [metric for metric, diff in difference.items() if diff is not None and abs(diff) > FLAG]
    return {"simulated": simulated, "difference": difference, "over_10_percent": over}


def compare(report: dict[str, Any], work: Path, configs: set[str] | None = None) -> dict[str, Any]:
    from transformers import AutoTokenizer

    launch = emulated_launch(DEVICE, MODEL)
    pricer, fit = latency_fit(parse_args(["--seed", str(report.get("seed", 0))]))
    cost = CostModel(model_spec(MODEL), HardwareSpec.resolve(HARDWARE))
    setup = {
        "latency_model": fit.models[fit.best_form()].to_dict(),
        "bros_model": fit.models["bros"],
        "swap": SwapModel.fit(H100_H2D_SAMPLES, cost.model.kv_bytes_per_token),
        "sizing": launch.sizing,
        "cost": cost,
        "step": pricer.step,
    }
    tokenizer = AutoTokenizer.from_pretrained(str(prepare(STAND_IN)[0]))
    # The batch's lines ask for exactly their output (`paper_lines`: ``max_tokens``, ``ignore_eos``).
    offline = [
        dataclasses.replace(request, max_new_tokens=request.output_len, exact=True)
        for request in paper_requests(report["offline_trace"], report["offline_lines"], cost, report.get("seed", 0))
    ]
    rows = []
    for cell in report["cells"]:
        seeds = [FIRST_EVAL_SEED + index for index in range(report["seeds"])]
        arrivals = {seed: online_arrivals(report, cell["rate_per_s"], seed, tokenizer) for seed in seeds}
        for config, runs in cell["runs"].items():
            if configs is not None and config not in configs:
                continue
            emulated = {metric: statistics.fmean(run[metric] for run in runs) for metric in COMPARED}
            row: dict[str, Any] = {
                "share": cell["share"],
                "rate_per_s": cell["rate_per_s"],
                "config": config,
                "emulated": emulated,
                "host_late_share": statistics.fmean(run.get("host_late_share", 0.0) for run in runs),
            }
            if config in BY_CONCURRENCY:
                row["why"] = "offline concurrency has no counterpart in the simulator"
            else:
                value = cell["search"][config]["value"] if config in cell["search"] else None
                host = host_gaps(work, config, cell["share"], value, runs)
                row["host_gaps"] = host.summary()
                for key, with_host in (("gpu_host", None), ("this_host", host)):
                    sims = [simulate(config, value, cell, arrivals[seed], offline, setup, with_host) for seed in seeds]
                    row[key] = versus(emulated, sims)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"report": report.get("source"), "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| load | config | P99 TTFT ms (emulated / sim / sim with host) | P99 TBT ms | offline tok/s | host late "
        "| over 10%, sim with host |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:

        def triple(metric: str, scale: float, digits: int, row: dict[str, Any] = row) -> str:
            figures = [row["emulated"][metric]] + [
                row[key]["simulated"][metric] if key in row else None for key in ("gpu_host", "this_host")
            ]
            return " / ".join("-" if figure is None else f"{figure * scale:.{digits}f}" for figure in figures)

        over = row.get("why") or ", ".join(row["this_host"]["over_10_percent"]) or "none"
        lines.append(
            f"| {row['share']:.0%} | {row['config']} | {triple('ttft_p99', 1000, 0)} | {triple('tbt_p99', 1000, 1)} | "
            f"{triple('offline_tokens_per_s', 1, 0)} | {row['host_late_share']:.1%} | {over} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=RESULTS / "colocation_emulated.json")
    parser.add_argument(
        "--work", type=Path, help="the report's work folder, with its iteration records (default: beside the report)"
    )
    parser.add_argument("--configs", help="comma-separated configurations to check (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS / "colocation_sim_check.json")
    args = parser.parse_args(argv)
    report = {**json.loads(args.report.read_text()), "source": str(args.report)}
    work = args.work or args.report.parent / f"{args.report.stem}-work"
    result = compare(report, work, set(args.configs.split(",")) if args.configs else None)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
