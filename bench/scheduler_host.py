"""What offline work costs SGLang's scheduler loop: the plugin's time per iteration and the host's
gap between forwards, with a backlog of offline lines and without, on the same server.

An emulated H100 (Llama-3.1-8B shapes) with forwards free leaves only the host to measure. Each
configuration (a co-location mode and where the offline policy plans: `core.policy_worker`) gets a
server of its own, and on it, in order:

1. **online only**: ``--online`` chat requests one after another (16 tokens, ``ignore_eos``);
2. **with a backlog**: ``--backlog`` offline lines sent at once (one batched ``/generate`` with the
   offline routing key, so every line reaches the scheduler, nothing held back by a runner's
   window), then the same online requests while the backlog runs.

Each phase reads the scheduler's ``/server_info``: the plugin's time per iteration (p50, p99: what
its hooks spent outside SGLang's code, `sglang_plugin.plugin_time`), the median host gap between
forwards over the last iteration records, and the length of SGLang's waiting queue against the
backlog. Goals (issue: offline work off the critical path): plugin p99 <= 0.5 ms; the median gap
with a backlog <= 1.2x online only's.

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


def settings(mode: str, worker: str, model: dict[str, Any]) -> PluginSettings:
    if mode == "off":
        return PluginSettings(policy_worker=worker)
    extra: dict[str, Any] = (
        {"latency_budget_s": HYGEN_BUDGET_S}
        if mode == "hygen"
        else {"ttft_slo_s": ECHO_TTFT_S, "tpot_slo_s": ECHO_TPOT_S}
    )
    return PluginSettings(
        offline_policy="blendserve" if mode != "hygen" else "psm",
        policy_worker=worker,
        colocation=ColocationConfig(mode=mode, latency_model=model, **extra),
    )


def start(work: Path, mode: str, worker: str, model: dict[str, Any]) -> ServerProcess:
    launch = emulated_launch(DEVICE, MODEL, with_free_port(["--enable-cache-report"]))
    plugin = launch.settings_for(settings(mode, worker, model))
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


class RecordSampler:
    """Reads the scheduler's last iteration records every ``every_s`` (it keeps 256), gathering a
    phase's records by iteration number; a sample of them when the loop outruns the reads."""

    def __init__(self, http: httpx.AsyncClient, every_s: float = 0.1) -> None:
        self.http, self.every_s = http, every_s
        self.records: dict[int, dict[str, Any]] = {}
        self.state: dict[str, Any] = {}
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            self.state = await plugin_state(self.http)
            for record in self.state.get("iterations", []):
                self.records[record["iteration"]] = record
            await asyncio.sleep(self.every_s)

    def __enter__(self) -> RecordSampler:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def figures(self) -> dict[str, Any]:
        """The plugin's time and the host gaps over the phase's records (gaps only between
        consecutive iterations)."""
        records = [self.records[key] for key in sorted(self.records)]
        plugin = sorted(record.get("plugin_s", 0.0) for record in records)
        gaps = [
            gap
            for previous, record in zip(records, records[1:])
            if record["iteration"] == previous["iteration"] + 1 and (gap := gap_after(previous, record)) is not None
        ]

        def at(values: list[float], quantile: float) -> float | None:
            return round(values[min(len(values) - 1, int(quantile * len(values)))] * 1000, 4) if values else None

        return {
            "records": len(records),
            "plugin_p50_ms": at(plugin, 0.5),
            "plugin_p99_ms": at(plugin, 0.99),
            "gap_median_ms": round(statistics.median(gaps) * 1000, 4) if gaps else None,
            "gaps": len(gaps),
            "batch_requests_median": statistics.median(
                [sum(record.get(kind, 0) for kind in ("offline_decode", "online_decode", "offline_prefill",
                                                       "online_prefill")) for record in records]
            ) if records else None,
            "plugin_time": self.state.get("plugin_time"),
        }


async def run_config(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=None) as http:
        await online(http, 5)  # warm up
        with RecordSampler(http) as sampler:
            alone = await online(http, args.online)
            await asyncio.sleep(0.3)
        alone_figures = sampler.figures()
        body = {"text": [f"Offline line {index}: summarise the water cycle." for index in range(args.backlog)],
                "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True},
                "routing_key": "sgl-blend-offline"}
        began = time.monotonic()
        offline = asyncio.create_task(http.post("/generate", json=body))
        queue_looks = []
        while not offline.done():  # until half the backlog is in the scheduler
            await asyncio.sleep(0.5)
            pool = (await plugin_state(http)).get("offline") or {}
            loads = (await http.get("/v1/loads", params={"include": "core"})).json()
            queue_looks.append({"backlog": pool.get("backlog"), "pending": pool.get("pending"),
                                "running": pool.get("running"), "loads": loads})
            if pool.get("counts", {}).get("submitted", 0) >= args.backlog // 2:
                break
        with RecordSampler(http) as sampler:
            during = await online(http, args.online)
            await asyncio.sleep(0.3)
        during_figures = sampler.figures()
        (await offline).raise_for_status()
        seconds = time.monotonic() - began
        done_state = await plugin_state(http)
    return {
        "online_only": {"latency": summary(alone), **alone_figures},
        "with_backlog": {"latency": summary(during), **during_figures, "queue": queue_looks[-3:],
                         "offline_seconds": round(seconds, 2), "offline_lines_per_s": round(args.backlog / seconds, 1)},
        "pool": {key: value for key, value in (done_state.get("offline") or {}).items()
                 if key not in ("iterations", "admissions", "policy_calls")},
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
        server = start(args.work, mode, worker, model)
        try:
            result = asyncio.run(run_config(server, args))
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
