"""BROS in the simulator: RT latency and SLO attainment, BE throughput, four policies, rising RT load.

RT load: ShareGPT prompts (real prompts tokenised, real reply lengths) arriving as a Poisson
process at each rate. BE load: synthetic, prompt ~ U(512, 1024), output ~ U(32, 128), a closed
loop of ``--be-concurrency`` jobs. Policies (`sgl_blend.sim.bros_engine`): SGLang's default FCFS,
round-robin between the classes, BROS with recompute instead of bidirectional KV, and BROS. The
BROS policies run `sgl_blend.core.bros`, the same code as `sgl-blend serve --colocation bros`.

The modelled device is one H100 at the compute and bandwidth measured on the lab's H100
(``bench/results/calibration_h100.json`` on main: 774.6 TFLOP/s bf16 GEMM, 2.97 TB/s, H2D copy
54.1 GB/s) serving Llama-3.1-8B with ``--kv-tokens`` of KV memory (a small KV pool, as the
paper's A100-40GB is, so that RT and BE compete for it). The scheduler predicts with the
``bros`` form fitted on the device's profile, never with the device itself.

Targets, as ratios within one run: RT normalized latency >= 50% lower than FCFS at the highest
rate; BE throughput loss <= 12% against FCFS (mean over rates); TTFT attainment >= 5x FCFS at
the highest rate (overload); bidirectional KV >= 1.2x the TPOT attainment (per token) of
recompute at the highest rate.

With ``--engine`` it also measures the real CPU engine (tiny-llama): the same kind of load at
CPU scale -- ShareGPT prompts at ``--engine-rate`` per second, streamed, beside a closed loop of
synthetic offline lines -- against SGLang's default scheduling and against
``--colocation bros`` with the ``bros`` form fitted by ``sgl-blend profile --latency``. Those
figures are reported as measured, with no target.

    python -m bench.bros            # writes bench/results/bros.json and bros.png
    python -m bench.bros --engine --latency-model bench/results/latency-model.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from sgl_blend.core.bros.cost import SwapModel
from sgl_blend.core.bros.requests import SLO
from sgl_blend.core.cost_model import BUILTIN_MODELS, HardwareSpec
from sgl_blend.sim.bros_device import RooflineDevice
from sgl_blend.sim.bros_engine import POLICIES, SimSettings, poisson_arrivals, simulate

RESULTS = Path(__file__).parent / "results"
H100_MEASURED = HardwareSpec("h100-measured", 774.6e12, 2.9715e12, 54.9e9)
# Pinned host-to-device copies timed by kernels/transfer.py on the H100 (bytes, seconds).
H2D_SAMPLES = ((1048576, 3.2017e-05), (16777216, 3.18247e-04), (67108864, 1.239361e-03), (268435456, 5.097975e-03))


def rt_lengths(count: int, seed: int) -> list[tuple[int, int]]:
    from sgl_blend.workloads import sharegpt

    return [(request.prompt_len, request.output_len) for request in sharegpt.load(count, seed=seed)]


def targets(by_rate: dict[float, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    high = by_rate[max(by_rate)]

    def ratio(top: float | None, bottom: float | None) -> float | None:
        if top is None or bottom is None:
            return None
        return top / bottom if bottom > 0 else float("inf") if top > 0 else None

    def mean_be(policy: str) -> float:
        return sum(run[policy]["be_requests_per_s"] for run in by_rate.values()) / len(by_rate)

    latency_cut = 1 - high["bros"]["normalized_latency_s"] / high["fcfs"]["normalized_latency_s"]
    be_loss = 1 - mean_be("bros") / mean_be("fcfs")
    ttft = ratio(high["bros"]["ttft_attainment"], high["fcfs"]["ttft_attainment"])
    tpot = ratio(high["bros"]["tpot_attainment_per_token"], high["bros-recompute"]["tpot_attainment_per_token"])
    return {
        "rate_high": max(by_rate),
        "rt_normalized_latency_cut_vs_fcfs": latency_cut, "met_latency": latency_cut >= 0.5,
        "be_throughput_loss_vs_fcfs": be_loss, "met_be_loss": be_loss <= 0.12,
        "ttft_attainment_x_fcfs": ttft, "met_ttft": ttft is not None and ttft >= 5,
        "tpot_attainment_x_recompute": tpot, "met_tpot": tpot is not None and tpot >= 1.2,
    }


def client_metrics(timings: list[Any], be_done: int, window_s: float, slo: SLO) -> dict[str, Any]:
    """BROS's metrics from what a streaming client saw (`online_replay.RequestTiming`)."""
    done = [t for t in timings if t.error is None and t.ttft is not None and t.tokens > 0]
    gaps = [gap for t in done for gap in t.gaps]
    with_gaps = [t for t in done if t.gaps]

    def share(hits: int, total: int) -> float | None:
        return hits / total if total else None

    return {
        "rt_requests": len(timings), "rt_completed": len(done),
        "normalized_latency_s": sum((t.ttft + sum(t.gaps)) / t.tokens for t in done) / len(done) if done else None,
        "ttft_attainment": share(sum(t.ttft <= slo.ttft_s for t in done), len(done)),
        "tpot_attainment_per_token": share(sum(gap <= slo.tpot_s for gap in gaps), len(gaps)),
        "tpot_attainment_per_request": share(sum(sum(t.gaps) / len(t.gaps) <= slo.tpot_s for t in with_gaps),
                                             len(with_gaps)),
        "be_requests_per_s": be_done / window_s if window_s > 0 else None,
    }


def synthetic_be_lines(count: int, seed: int) -> list[Any]:
    """Offline lines with prompts of U(512, 1024) tokens (words from a small vocabulary, about a
    token each) and U(32, 128) output tokens."""
    from sgl_blend.jobs.lines import BatchLine, parse_line

    rng = random.Random(seed)
    words = ["alpha", "river", "stone", "light", "paper", "cloud", "green", "metal", "field", "north"]
    lines = []
    for index in range(count):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(512, 1024)))
        body = {"model": "default", "prompt": prompt, "max_tokens": rng.randint(32, 128), "temperature": 0,
                "ignore_eos": True}
        line = parse_line(json.dumps({"custom_id": f"be-{index}", "method": "POST", "url": "/v1/completions",
                                      "body": body}), index + 1)
        if isinstance(line, BatchLine):
            lines.append(line)
    return lines


def run_engine(args: argparse.Namespace) -> dict[str, Any]:
    """Default SGLang scheduling and bros mode on tiny-llama, one server at a time, same load."""
    import asyncio

    from bench.colocation import online_trace, sharegpt_prompts
    from sgl_blend.launch.colocation import colocation_launch, with_free_port
    from sgl_blend.core.colocation import ColocationConfig
    from sgl_blend.core.latency_model import load_model
    from sgl_blend.measure.online_replay import OfflineLoad, replay_with_offline
    from sgl_blend.launch.supervisor import start_server
    from sgl_blend.sglang_plugin.settings import OFF, PluginSettings

    slo = SLO()
    prompts = sharegpt_prompts(400, args.seed, max_chars=2000, max_tokens_cap=64)
    trace = online_trace("poisson", args.engine_rate, args.engine_duration, 1.0, prompts, args.seed)
    lines = synthetic_be_lines(64, args.seed)
    base = ["--max-total-tokens", str(args.engine_kv_tokens)]
    bros = ColocationConfig(mode="bros", latency_model=load_model(args.latency_model, "bros").to_dict())
    bros_settings = PluginSettings(offline_policy=OFF, colocation=bros)
    modes = {"sglang-default": (with_free_port(base), PluginSettings(offline_policy=OFF)),
             "bros": (colocation_launch(bros_settings, with_free_port(base)), bros_settings)}
    results: dict[str, Any] = {}
    for name, (sglang_args, settings) in modes.items():
        server = start_server("tiny-llama", sglang_args, log_path=args.out.with_name(f"bros-engine-{name}.log"),
                              settings=settings)
        try:
            offline = OfflineLoad(server.base_url, lines, concurrency=args.engine_be_concurrency)
            timings, window = asyncio.run(replay_with_offline(server.base_url, trace, offline))
            be_done = sum(1 for at, _ in offline.completions if window["start"] <= at < window["start"] + window["window_s"])
            results[name] = client_metrics(timings, be_done, window["window_s"], slo)
        finally:
            server.stop()
        print(f"engine {name:15s} {results[name]}", flush=True)
    return {"settings": {"rate": args.engine_rate, "duration_s": args.engine_duration,
                         "kv_tokens": args.engine_kv_tokens, "be_concurrency": args.engine_be_concurrency,
                         "latency_model": str(args.latency_model)}, "runs": results}


def plot(by_rate: dict[float, dict[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("normalized_latency_s", "RT normalized latency (s/token)"), ("ttft_attainment", "TTFT attainment"),
              ("tpot_attainment_per_token", "TPOT attainment (per token)"), ("be_requests_per_s", "BE requests/s"))
    rates = sorted(by_rate)
    figure, axes = plt.subplots(1, len(panels), figsize=(18, 4))
    for axis, (key, title) in zip(axes, panels):
        for policy in POLICIES:
            axis.plot(rates, [by_rate[rate][policy][key] for rate in rates], marker="o", label=policy)
        axis.set_title(title)
        axis.set_xlabel("RT requests/s")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[4.0, 8.0, 16.0, 24.0])
    parser.add_argument("--duration", type=float, default=60.0, help="simulated seconds per run")
    parser.add_argument("--kv-tokens", type=int, default=32768)
    parser.add_argument("--be-concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "bros.json")
    parser.add_argument("--engine", action="store_true", help="also measure the real CPU engine (tiny-llama)")
    parser.add_argument("--latency-model", type=Path, default=RESULTS / "latency-model.json",
                        help="a `sgl-blend profile --latency` file with a fitted bros form (for --engine)")
    parser.add_argument("--engine-rate", type=float, default=2.0, help="RT requests per second on the engine")
    parser.add_argument("--engine-duration", type=float, default=60.0)
    parser.add_argument("--engine-kv-tokens", type=int, default=8192)
    parser.add_argument("--engine-be-concurrency", type=int, default=8)
    parser.add_argument("--skip-sim", action="store_true", help="with --engine: keep the saved simulator runs")
    args = parser.parse_args(argv)
    if args.skip_sim:
        report = json.loads(args.out.read_text())
        report["engine"] = run_engine(args)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        return 0
    model = BUILTIN_MODELS["llama-3.1-8b"]
    swap = SwapModel.fit(H2D_SAMPLES, model.kv_bytes_per_token)
    device = RooflineDevice(model, H100_MEASURED, swap)
    cost = device.fitted_cost()
    settings = SimSettings(kv_tokens=args.kv_tokens, duration_s=args.duration, be_concurrency=args.be_concurrency,
                           seed=args.seed)
    lengths = rt_lengths(4000, args.seed)
    by_rate: dict[float, dict[str, dict[str, Any]]] = {}
    for rate in args.rates:
        arrivals = poisson_arrivals(lengths, rate, settings.duration_s, args.seed)
        by_rate[rate] = {}
        for policy in POLICIES:
            started = time.process_time()
            result = simulate(policy, arrivals, device, cost, settings)
            result["cpu_s"] = time.process_time() - started
            by_rate[rate][policy] = result
            print(f"rate {rate:5.1f} {policy:15s} norm-lat {result['normalized_latency_s']:.4f} "
                  f"TTFT {result['ttft_attainment']:.3f} TPOT/tok {result['tpot_attainment_per_token']:.3f} "
                  f"BE/s {result['be_requests_per_s']:.2f}", flush=True)
    given = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    report = {"settings": {**given, "model": model.name, "hardware": H100_MEASURED.name,
                           "swap_model": vars(swap), "block_size": settings.block_size,
                           "max_running": settings.max_running, "slo": vars(settings.slo)},
              "latency_model": cost.model.to_dict(),
              "runs": {str(rate): runs for rate, runs in by_rate.items()}, "targets": targets(by_rate)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(by_rate, args.out.with_suffix(".png"))
    print(json.dumps(report["targets"], indent=2))
    if args.engine:
        report["engine"] = run_engine(args)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
