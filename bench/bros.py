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

Targets, as ratios within one run (`targets`; JSON and ``bros.md`` say whether each is reached):
RT normalized latency >= 50% lower than FCFS at the highest rate; BE throughput loss <= 12%
against FCFS (BE requests/s, mean over rates, as the paper reports it; per rate too); TTFT
attainment >= 5x FCFS at the highest rate (overload); bidirectional KV >= 1.2x the TPOT
attainment (per token) of recompute at the highest rate (per rate too). Every policy has the same
KV, running-request cap and prefill token budget (``--prefill-token-budget``).

With ``--engine`` it also measures the real CPU engine (tiny-llama): the same kind of load at
CPU scale -- ShareGPT prompts at ``--engine-rate`` per second, streamed, beside a closed loop of
synthetic offline lines -- against SGLang's default scheduling and against
``--colocation bros`` with the ``bros`` form fitted by ``sgl-blend profile --latency``. Those
figures are reported as measured, with no target.

    python -m bench.bros            # writes bench/results/bros.{json,md,png}
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
from sgl_blend.sim.bros_device import H100_H2D_SAMPLES, RooflineDevice
from sgl_blend.sim.bros_engine import POLICIES, SimSettings, poisson_arrivals, simulate

RESULTS = Path(__file__).parent / "results"
H100_MEASURED = HardwareSpec("h100-measured", 774.6e12, 2.9715e12, 54.9e9)


def rt_lengths(count: int, seed: int) -> list[tuple[int, int]]:
    from sgl_blend.workloads import sharegpt

    return [(request.prompt_len, request.output_len) for request in sharegpt.load(count, seed=seed)]


TARGETS = {"latency_cut": 0.5, "be_loss": 0.12, "ttft_x": 5.0, "tpot_x": 1.2}


def _ratio(top: float | None, bottom: float | None) -> float | None:
    """None when either side is missing or the bottom is 0 (the targets then say what they need)."""
    if top is None or bottom is None or bottom <= 0:
        return None
    return top / bottom


def targets(by_rate: dict[float, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The paper's claims as ratios within one run. BE throughput loss is the paper's: BE requests/s
    of bros against the FCFS engine, averaged over the RT rates (per rate too). Bidirectional KV
    against recompute is TPOT attainment at the highest rate, where memory contention is worst
    (per rate too, per token and per request)."""
    rates = sorted(by_rate)
    high = by_rate[rates[-1]]

    def mean_be(policy: str) -> float:
        return sum(by_rate[rate][policy]["be_requests_per_s"] for rate in rates) / len(rates)

    def per_rate(key: str, top: str, bottom: str) -> dict[str, float | None]:
        return {str(rate): _ratio(by_rate[rate][top][key], by_rate[rate][bottom][key]) for rate in rates}

    latency_cut = 1 - high["bros"]["normalized_latency_s"] / high["fcfs"]["normalized_latency_s"]
    be_loss = 1 - mean_be("bros") / mean_be("fcfs")
    be_loss_by_rate = {rate: (None if ratio is None else 1 - ratio)
                       for rate, ratio in per_rate("be_requests_per_s", "bros", "fcfs").items()}
    ttft_fcfs, ttft_bros = high["fcfs"]["ttft_attainment"], high["bros"]["ttft_attainment"]
    ttft = _ratio(ttft_bros, ttft_fcfs)
    tpot_by_rate = per_rate("tpot_attainment_per_token", "bros", "bros-recompute")
    tpot = tpot_by_rate[str(rates[-1])]
    return {
        "rate_high": rates[-1],
        "rt_normalized_latency_cut_vs_fcfs": latency_cut, "met_latency": latency_cut >= TARGETS["latency_cut"],
        "be_throughput_loss_vs_fcfs": be_loss, "be_throughput_loss_by_rate": be_loss_by_rate,
        "met_be_loss": be_loss <= TARGETS["be_loss"],
        "ttft_attainment_x_fcfs": ttft, "ttft_attainment_bros_fcfs": [ttft_bros, ttft_fcfs],
        "met_ttft": (ttft is not None and ttft >= TARGETS["ttft_x"]) or (not ttft_fcfs and bool(ttft_bros)),
        "tpot_attainment_x_recompute": tpot, "tpot_attainment_x_recompute_by_rate": tpot_by_rate,
        "tpot_attainment_per_request_x_recompute_by_rate": per_rate("tpot_attainment_per_request", "bros",
                                                                    "bros-recompute"),
        "met_tpot": tpot is not None and tpot >= TARGETS["tpot_x"],
    }


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    """The policy table and the targets, each target with the figures it rests on."""
    lines = ["| RT/s | policy | norm. latency (s/token) | TTFT attainment | TPOT attainment per token / per request "
             "| BE req/s | RT finished | idle s |", "|---|---|---|---|---|---|---|---|"]
    for rate, runs in report["runs"].items():
        for policy, run in runs.items():
            lines.append(f"| {float(rate):g} | {policy} | {_fmt(run['normalized_latency_s'], 4)} | "
                         f"{_fmt(run['ttft_attainment'])} | {_fmt(run['tpot_attainment_per_token'])} / "
                         f"{_fmt(run['tpot_attainment_per_request'])} | {_fmt(run['be_requests_per_s'], 2)} | "
                         f"{run['rt_finished']} | {run['idle_s']:.1f} |")
    goal = report["targets"]
    high = f"{goal['rate_high']:g} RT/s"
    losses = ", ".join(f"{float(rate):g}: {_fmt(None if loss is None else 100 * loss, 0)}%"
                       for rate, loss in goal["be_throughput_loss_by_rate"].items())
    tpots = ", ".join(f"{float(rate):g}: {_fmt(ratio, 2)}x" for rate, ratio in goal["tpot_attainment_x_recompute_by_rate"].items())
    rows = [
        (f"RT normalized latency >= {TARGETS['latency_cut']:.0%} lower than FCFS at {high}",
         f"{goal['rt_normalized_latency_cut_vs_fcfs']:.0%} lower", goal["met_latency"]),
        (f"TTFT attainment >= {TARGETS['ttft_x']:g}x FCFS at {high}",
         " vs ".join(_fmt(value) for value in goal["ttft_attainment_bros_fcfs"]), goal["met_ttft"]),
        (f"BE throughput loss <= {TARGETS['be_loss']:.0%} vs FCFS (mean over rates)",
         f"{goal['be_throughput_loss_vs_fcfs']:.0%} (per rate {losses})", goal["met_be_loss"]),
        (f"bidirectional KV >= {TARGETS['tpot_x']:g}x recompute in TPOT attainment per token at {high}",
         f"{_fmt(goal['tpot_attainment_x_recompute'], 2)}x (per rate {tpots})", goal["met_tpot"]),
    ]
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {target} | {measured} | {'yes' if met else '**no**'} |" for target, measured, met in rows]
    return "\n".join(lines)


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
    from sgl_blend.batch_lines.lines import BatchLine, parse_line

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
    parser.add_argument("--prefill-token-budget", type=int, default=SimSettings.prefill_token_budget,
                        help="prefill tokens per iteration beyond the first prefill, every policy")
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
    swap = SwapModel.fit(H100_H2D_SAMPLES, model.kv_bytes_per_token)
    device = RooflineDevice(model, H100_MEASURED, swap)
    cost = device.fitted_cost()
    settings = SimSettings(kv_tokens=args.kv_tokens, duration_s=args.duration, be_concurrency=args.be_concurrency,
                           prefill_token_budget=args.prefill_token_budget,
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
    args.out.with_suffix(".md").write_text(markdown(report) + "\n")
    plot(by_rate, args.out.with_suffix(".png"))
    print(markdown(report))
    if args.engine:
        report["engine"] = run_engine(args)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
