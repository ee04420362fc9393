"""Simulate an offline job at paper scale: the same plan, feed and policies as run-batch, on a modelled GPU."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sgl_blend.core.policy_registry import SIM, describe, lookup

NAME = "sim"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        default="trace2",
        help="trace1..trace4 (Table 2), DENSITY:SHARING (e.g. 1.2:0.25), sharegpt, a workload JSONL, "
        "or an OpenAI batch file (read as `sgl-blend estimate` reads it)",
    )
    parser.add_argument("--n", type=int, default=40000, help="requests in a generated workload")
    parser.add_argument("--policy", default="blendserve", help="comma-separated: " + describe(SIM))
    parser.add_argument("--model", default="llama-3.1-8b", help="llama-3.1-8b, llama-3.1-70b or an HF model directory")
    parser.add_argument(
        "--device",
        default="a100-80g",
        help="h100, a100-80g, or a profile JSON naming its memory: the engine's KV pool, chunk and "
        "running limit are a stock SGLang server's on it, as run-batch --emulate sizes them",
    )
    parser.add_argument(
        "--hardware",
        default=None,
        help="price forwards with this profile (a100-80g, h100-sxm, h200, or hw.json) instead of the device's own spec",
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    parser.add_argument("--overlap", default="interference", choices=("sum", "max", "interference", "fitted"))
    parser.add_argument(
        "--interference",
        type=float,
        default=None,
        help="lambda, the weight of the smaller term (default: the hardware profile's measured "
        "corun_interference, 0.90 for two streams; 0.24 is the nanoflow-bound setting)",
    )
    parser.add_argument("--fitted", default=None, help="a,b,k of the fitted overlap a*max + b*min + k")
    parser.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=None,
        help="the engine's prefill chunk, shared with decodes (default: SGLang's for the device)",
    )
    parser.add_argument("--max-running-requests", type=int, default=None, help="default: SGLang's for the device")
    parser.add_argument("--max-total-tokens", type=int, default=None, help="KV pool tokens (default: SGLang's)")
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=None,
        help="lines handed to the engine at once (default: the batch runner's window)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-workload", type=Path, default=None, help="write the generated workload as JSONL")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--plot", type=Path, default=None, help="draw compute and memory time per step (Figure 10)")


def load_workload(spec: str, n: int, cost, seed: int, model: str) -> tuple[list, dict]:
    """A file is a workload JSONL or an OpenAI batch file, the latter read as `sgl-blend estimate`
    reads it (tokenised for ``model``'s served tokenizer); anything else names a generated workload."""
    from sgl_blend.sim.batch_file import load_batch_file
    from sgl_blend.workloads import io, sharegpt
    from sgl_blend.workloads.mixer import named_workload

    path = Path(spec)
    if path.is_file():
        if io.is_workload_file(path):
            return io.load_jsonl(path)
        batch = load_batch_file(path, model)
        return batch.requests, {
            "batch_file": spec,
            "invalid_lines": batch.invalid,
            "lines_without_max_tokens": batch.unbounded,
        }
    if spec.endswith(".jsonl"):
        raise ValueError(f"{spec} is not a file")
    meta = {"workload": spec, "n": n, "seed": seed}
    if spec == "sharegpt":
        return sharegpt.load(n, seed), meta
    return named_workload(spec, n, cost, seed), meta


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from sgl_blend.core.cost_model import CostModel, HardwareSpec
    from sgl_blend.forward_time.overlap import hardware_overlap
    from sgl_blend.sim.metrics import compare_to, summarise, workload_bound
    from sgl_blend.sim.plot import binned, plot_steps
    from sgl_blend.sim.run import simulate
    from sgl_blend.sim.sizing import stock_engine
    from sgl_blend.workloads import io

    policies = args.policy.split(",")
    try:
        for name in policies:
            lookup(name, SIM)
        engine = stock_engine(
            args.model,
            args.device,
            args.tp,
            hardware=HardwareSpec.resolve(args.hardware) if args.hardware else None,
            chunk=args.chunked_prefill_size,
            max_running=args.max_running_requests,
            kv_tokens=args.max_total_tokens,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model, hardware, config = engine.model, engine.hardware, engine.config
    cost = CostModel(model, hardware)
    coefficients = [float(part) for part in args.fitted.split(",")] if args.fitted else []
    if coefficients and len(coefficients) != 3:
        print(f"error: --fitted takes three numbers a,b,k, got {args.fitted!r}", file=sys.stderr)
        return 2
    fitted = (coefficients[0], coefficients[1], coefficients[2]) if coefficients else None
    overlap = hardware_overlap(hardware, args.overlap, args.interference, fitted)
    try:
        requests, meta = load_workload(args.workload, args.n, cost, args.seed, args.model)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not requests:
        print(f"error: {args.workload} has no runnable line", file=sys.stderr)
        return 1
    if args.save_workload:
        io.save_jsonl(requests, args.save_workload, meta)
    bound = workload_bound(requests, cost, overlap)
    report = {
        "workload": args.workload,
        "requests": len(requests),
        "model": model.name,
        "hardware": hardware.name,
        "overlap": overlap.name,
        "kv_tokens": config.kv_capacity,
        "chunked_prefill_size": config.token_budget,
        "max_running_requests": config.max_running,
        "bound": {
            "t_comp": round(bound.t_comp, 3),
            "t_mem": round(bound.t_mem, 3),
            "sharing": round(bound.sharing, 4),
            "density": round(bound.density, 4),
            "t_o": round(bound.t_o, 3),
            "t_o_ideal": round(bound.t_o_ideal, 3),
        },
        "policies": {},
    }
    report.update({key: meta[key] for key in ("invalid_lines", "lines_without_max_tokens") if key in meta})
    results = {}
    for name in policies:
        with tqdm(total=len(requests), desc=name, unit="req", file=sys.stderr, disable=len(requests) < 5000) as bar:
            results[name] = simulate(
                requests,
                name,
                model,
                hardware,
                overlap,
                seed=args.seed,
                config=config,
                on_finish=bar.update,
                window=args.max_inflight,
            )
        report["policies"][name] = summarise(results[name], bound)
    compare_to(report["policies"], results, "dfs")
    if args.plot:
        plot_steps(
            {name: binned(result) for name, result in results.items()},
            args.plot,
            f"{args.workload} on {model.name} / {hardware.name}",
        )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, entry in report["policies"].items():
            extra = f"  {entry['speedup_over_dfs']:.3f}x DFS" if "speedup_over_dfs" in entry else ""
            print(
                f"{name:>11}: {entry['tokens_per_s']:>10.0f} tok/s  {entry['fraction_of_t_o']:.3f} of T_o  "
                f"sharing {entry['sharing_ratio']:.3f}  comp {entry['compute_utilisation']:.2f}  "
                f"mem {entry['memory_utilisation']:.2f}{extra}"
            )
    return 0
