"""Simulate an offline job at paper scale: the same policies as the server, on a modelled GPU."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "sim"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="trace2",
                        help="trace1..trace4 (Table 2), density:sharing (e.g. 1.2:0.25), or a workload JSONL")
    parser.add_argument("--n", type=int, default=40000, help="requests in a generated workload")
    parser.add_argument("--policy", default="blendserve", help="comma-separated: blendserve, dfs, fcfs, random, lpm")
    parser.add_argument("--model", default="llama-3.1-8b", help="built-in model name or HF model directory")
    parser.add_argument("--hardware", default="a100-80g", help="a100-80g, h100-sxm, h200, NAMExTP, or a profile JSON")
    parser.add_argument("--overlap", default="interference", choices=("sum", "max", "interference"))
    parser.add_argument("--interference", type=float, default=None, help="weight of the smaller term")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--plot", type=Path, default=None, help="draw compute and memory time per step (Figure 10)")


def load_workload(spec: str, n: int, cost, seed: int):
    from bench.workloads.mixer import TABLE2_TRACES, mix
    from sgl_blend.sim.workload import load_jsonl

    if spec in TABLE2_TRACES:
        return mix(n, *TABLE2_TRACES[spec], cost, seed)
    if ":" in spec:
        density, sharing = (float(part) for part in spec.split(":"))
        return mix(n, density, sharing, cost, seed)
    return list(load_jsonl(Path(spec)))


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
    from sgl_blend.sim.overlap import DEFAULT_INTERFERENCE, overlap_function
    from sgl_blend.sim.plot import plot_steps
    from sgl_blend.sim.run import SIM_POLICIES, simulate, summarise, workload_bound

    policies = args.policy.split(",")
    unknown = [name for name in policies if name not in SIM_POLICIES]
    if unknown:
        print(f"error: unknown policy {', '.join(unknown)}; known: {', '.join(SIM_POLICIES)}", file=sys.stderr)
        return 2
    model, hardware = model_spec(args.model), HardwareSpec.resolve(args.hardware)
    cost = CostModel(model, hardware)
    requests = load_workload(args.workload, args.n, cost, args.seed)
    bound = workload_bound(requests, cost)
    overlap = overlap_function(args.overlap, args.interference if args.interference is not None else DEFAULT_INTERFERENCE)
    report = {"workload": args.workload, "requests": len(requests), "model": model.name, "hardware": hardware.name,
              "overlap": overlap.name, "bound": {key: round(value, 4) for key, value in bound.items()}, "policies": {}}
    results = {}
    for name in policies:
        with tqdm(total=len(requests), desc=name, unit="req", file=sys.stderr, disable=len(requests) < 5000) as bar:
            results[name] = simulate(requests, name, model, hardware, overlap, seed=args.seed, progress=bar.update)
        report["policies"][name] = summarise(results[name], bound)
    if "dfs" in results:
        dfs_sharing = results["dfs"].sharing_ratio
        for name, result in results.items():
            entry = report["policies"][name]
            entry["speedup_over_dfs"] = round(results["dfs"].seconds / result.seconds, 4)
            entry["sharing_fraction_of_dfs"] = round(result.sharing_ratio / dfs_sharing, 4) if dfs_sharing else 1.0
    if args.plot:
        plot_steps(results, args.plot, f"{args.workload} on {model.name} / {hardware.name}")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, entry in report["policies"].items():
            print(f"{name:>11}: {entry['tokens_per_s']:>10.0f} tok/s  {entry['fraction_of_t_o']:.3f} of T_o  "
                  f"sharing {entry['sharing_ratio']:.3f}  comp {entry['compute_utilisation']:.2f}  "
                  f"mem {entry['memory_utilisation']:.2f}")
    return 0
