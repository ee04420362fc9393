"""What offline work costs SGLang's scheduler loop: the plugin's time per iteration and the host's
gap between forwards, with a backlog of offline lines and without, on the same server.

An emulated H100 (Llama-3.1-8B shapes) with forwards free leaves only the host to measure. Each
configuration (a co-location mode and where the offline policy plans: `core.policy_worker`) gets a
server of its own, and on it, in order:

1. **online only**: ``--online`` chat requests one after another (16 tokens, ``ignore_eos``);
2. **with a backlog**: ``--backlog`` offline lines sent at once (one batched ``/generate`` with the
   offline routing key, so every line reaches the scheduler, nothing held back by a runner's
   window), then the same online requests while the backlog runs.

The server appends every iteration record to a file (its ``iteration_log``); each phase's records
give the plugin's time per iteration (p50, p99: what its hooks spent outside SGLang's code,
`sglang_plugin.plugin_time`) and the median host gap between consecutive forwards (with a
backlog, over the iterations that ran offline work). Goals (issue: offline work off the critical
path): plugin p99 <= 0.5 ms; the median gap with a backlog <= 1.2x online only's.

    python -m bench.scheduler_host --backlog 1000 --configs off:process,hygen:process,echo:process
    python -m bench.scheduler_host --backlog 50000 --configs off:process,off:inline

Writes ``bench/results/scheduler_host_{BACKLOG}.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.batch_load import summary
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.host_gap import gap_after
from sgl_blend.emulation.devices import resolve_device
from sgl_blend.emulation.launch import emulated_launch
from sgl_blend.emulation.pricing import ForwardPricer
from sgl_blend.forward_time.step_time import NoisyClock, fit_latency
from sgl_blend.launch.colocation import with_free_port
from sgl_blend.launch.flags import with_defaults
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.sglang_plugin.settings import PluginSettings

RESULTS = Path(__file__).parent / "results"
MODEL, DEVICE = "llama-3.1-8b", "h100"
OUTPUT_TOKENS = 16
GOALS = {"plugin_p99_ms": 0.5, "gap_over_online_only": 1.2}
# HyGen's fixed per-iteration budget and Echo's deadlines: generous, so that offline work runs.
HYGEN_BUDGET_S, ECHO_TTFT_S, ECHO_TPOT_S = 0.05, 0.5, 0.05


def latency_model() -> dict[str, Any]:
    """The latency model fitted on the emulated device's price, as the co-location judge fits it."""
    pricer = ForwardPricer.of(resolve_device(DEVICE), MODEL, 1)
    fit = fit_latency(NoisyClock(pricer.step, 0.02, seed=100), 400, 0)
    return fit.models[fit.best_form()].to_dict()


def settings(mode: str, worker: str, model: dict[str, Any], log: Path) -> PluginSettings:
    if mode == "off":
        return PluginSettings(policy_worker=worker, iteration_log=str(log))
    extra: dict[str, Any] = (
        {"latency_budget_s": HYGEN_BUDGET_S}
        if mode == "hygen"
        else {"ttft_slo_s": ECHO_TTFT_S, "tpot_slo_s": ECHO_TPOT_S}
    )
    return PluginSettings(
        offline_policy="blendserve" if mode != "hygen" else "psm",
        policy_worker=worker,
        iteration_log=str(log),
        colocation=ColocationConfig(mode=mode, latency_model=model, **extra),
    )


def start(work: Path, mode: str, worker: str, model: dict[str, Any], log: Path) -> ServerProcess:
    launch = emulated_launch(DEVICE, MODEL, with_free_port(["--enable-cache-report"]))
    plugin = launch.settings_for(settings(mode, worker, model, log))
    return start_server(
        str(launch.model_path),
        with_defaults(launch.sglang_args, plugin.sglang_flags()),
        log_path=work / f"{mode}-{worker}.log",
        settings=plugin,
        batch_api=None,
    )


async def online(http: httpx.AsyncClient, count: int) -> list[float]:
    latencies = []
    for index in range(count):
        began = time.monotonic()
        response = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True,
                  "messages": [{"role": "user", "content": f"Online question {index}: why is the sky blue?"}]},
        )
        response.raise_for_status()
        latencies.append(time.monotonic() - began)
    return latencies


async def plugin_state(http: httpx.AsyncClient) -> dict[str, Any]:
    info = (await http.get("/server_info")).json()
    return info["internal_states"][0]["sgl_blend"]


def read_records(path: Path, after: int) -> list[dict[str, Any]]:
    """The iteration records the server appended (its ``iteration_log``) after iteration ``after``."""
    records = []
    with path.open() as handle:
        for line in handle:
            record = json.loads(line)
            if record["iteration"] > after:
                records.append(record)
    return records


def figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The plugin's time per iteration and the host's gaps between consecutive forwards."""
    plugin = sorted(record.get("plugin_s", 0.0) for record in records)
    gaps = [
        gap
        for previous, record in zip(records, records[1:])
        if record["iteration"] == previous["iteration"] + 1 and (gap := gap_after(previous, record)) is not None
    ]

    def at(values: list[float], quantile: float) -> float | None:
        return round(values[min(len(values) - 1, int(quantile * len(values)))] * 1000, 4) if values else None

    return {
        "iterations": len(records),
        "plugin_p50_ms": at(plugin, 0.5),
        "plugin_p99_ms": at(plugin, 0.99),
        "gap_median_ms": round(statistics.median(gaps) * 1000, 4) if gaps else None,
        "gap_p99_ms": at(sorted(gaps), 0.99),
        "batch_requests_median": statistics.median([sum(record.get(kind, 0) for kind in COUNTS) for record in records])
        if records
        else None,
    }


COUNTS = ("offline_decode", "online_decode", "offline_prefill", "online_prefill")


def offline_ran(record: dict[str, Any]) -> bool:
    return record.get("offline_decode", 0) + record.get("offline_prefill", 0) > 0


async def last_iteration(http: httpx.AsyncClient) -> int:
    records = (await plugin_state(http)).get("iterations") or [{"iteration": 0}]
    return int(records[-1]["iteration"])


async def waiting(http: httpx.AsyncClient) -> int:
    loads = (await http.get("/v1/loads", params={"include": "core"})).json()["loads"]
    return sum(int(load["num_waiting_reqs"]) + int(load["num_running_reqs"]) for load in loads)


async def run_config(server: ServerProcess, log: Path, args: argparse.Namespace) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=None) as http:
        await online(http, 5)  # warm up
        before = await last_iteration(http)
        alone = await online(http, args.online)
        after_alone = await last_iteration(http)
        body = {"text": [f"Offline line {index}: summarise the water cycle." for index in range(args.backlog)],
                "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True},
                "routing_key": "sgl-blend-offline"}
        began = time.monotonic()
        offline = asyncio.create_task(http.post("/generate", json=body))
        most = 0
        while not offline.done():  # the online phase starts once half the backlog reached the scheduler
            await asyncio.sleep(0.2)
            most = max(most, await waiting(http))
            if most >= args.backlog // 2:
                break
        during = await online(http, args.online)
        (await offline).raise_for_status()
        seconds = time.monotonic() - began
        pool = (await plugin_state(http)).get("offline") or {}
    alone_records = read_records(log, before)
    alone_records = [record for record in alone_records if record["iteration"] <= after_alone]
    with_offline = [record for record in read_records(log, after_alone) if offline_ran(record)]
    return {
        "online_only": {"latency": summary(alone), **figures(alone_records)},
        "with_backlog": {"latency": summary(during), **figures(with_offline), "queued_most": most,
                         "offline_seconds": round(seconds, 2), "offline_lines_per_s": round(args.backlog / seconds, 1)},
        "pool": {key: value for key, value in pool.items() if key not in ("iterations", "admissions", "policy_calls")},
    }


def judge(result: dict[str, Any]) -> dict[str, Any]:
    alone, during = result["online_only"], result["with_backlog"]
    ratio = (during["gap_median_ms"] / alone["gap_median_ms"]
             if during["gap_median_ms"] and alone["gap_median_ms"] else None)
    return {"plugin_p99_ms": during["plugin_p99_ms"], "gap_over_online_only": round(ratio, 3) if ratio else None,
            "met": {"plugin_p99": (during["plugin_p99_ms"] or 0) <= GOALS["plugin_p99_ms"],
                    "gap": ratio is not None and ratio <= GOALS["gap_over_online_only"]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=1000)
    parser.add_argument("--online", type=int, default=40, help="online requests per phase")
    parser.add_argument("--configs", default="off:process,hygen:process,echo:process",
                        help="comma-separated MODE:WORKER (modes off, hygen, echo; workers process, thread, inline)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sgl-blend-scheduler-host"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or RESULTS / f"scheduler_host_{args.backlog}.json"
    args.work.mkdir(parents=True, exist_ok=True)
    model = latency_model()
    report: dict[str, Any] = {"backlog": args.backlog, "online": args.online, "goals": GOALS, "configs": {}}
    for config in args.configs.split(","):
        mode, worker = config.split(":")
        log = args.work / f"{mode}-{worker}.records.jsonl"
        log.unlink(missing_ok=True)
        server = start(args.work, mode, worker, model, log)
        try:
            result = asyncio.run(run_config(server, log, args))
        finally:
            server.stop()
        result["judged"] = judge(result)
        report["configs"][config] = result
        print(json.dumps({config: {k: v for k, v in result.items() if k != "pool"}}, indent=1), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
