"""BlendServe's simulated results, regenerated: the four Table 2 traces and the 65-workload grid.

    python -m bench.paper_reproduction                # paper scale: 400K-request traces, 40K grid
    python -m bench.paper_reproduction --quick        # 20K traces, 5K grid: a few minutes
    python -m bench.paper_reproduction --jobs 2       # simulations in 2 worker processes

Every policy runs the same workload on the same simulated engine (``sgl_blend.sim``) and cost
model; only the admission order differs. Traces run on Llama-3.1-8B / A100-80G and on
Llama-3.1-70B / 8xA100 (TP=8 as a hardware scale), each mixed with its own cost model as the
paper re-synthesises per model. Writes ``paper_reproduction.json`` (with each simulation's wall
time), a Markdown table with the paper's figures beside ours, a heat map of the grid's speedup
over DFS, and Figure 10 for Trace#2.

Iterations pay for their weight reads, lambda is the measured two-stream co-run (0.90) unless
``--interference`` says otherwise (0.24 is the nanoflow-bound setting), and every policy runs at
the engine's default 2048-token chunk. `bench.sim_ablation` is the like-for-like comparison: it
sweeps the chunk for every policy and separates BlendServe's order from its prefill pacing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from sgl_blend.workloads.mixer import GRID_DENSITIES, GRID_SHARINGS, TABLE2_TRACES, mix
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.sim.engine import EngineConfig
from sgl_blend.sim.metrics import compare_to, summarise, workload_bound
from sgl_blend.core.cost_model import TWO_STREAM_INTERFERENCE
from sgl_blend.forward_time.overlap import overlap_function
from sgl_blend.sim.plot import binned, plot_steps
from sgl_blend.sim.run import simulate

RESULTS = Path(__file__).parent / "results"
SETUPS = {"llama-3.1-8b / a100-80g": ("llama-3.1-8b", "a100-80g", 1),
          "llama-3.1-70b / 8xa100-80g (TP=8)": ("llama-3.1-70b", "a100-80g", 8)}
TRACE_POLICIES = ("dfs", "lpm", "fcfs", "random", "blendserve")
GRID_POLICIES = ("dfs", "blendserve")
FIGURE10_SETUP, FIGURE10_TRACE, FIGURE10_POLICIES = "llama-3.1-8b / a100-80g", "trace2", ("dfs", "random", "blendserve")
PAPER = {"blendserve_fraction_of_t_o": 0.866, "speedup_over_nanoflow_dfs": 1.208, "grid_mean_speedup": 1.23,
         "grid_min_speedup": 1.14, "grid_max_speedup": 1.34, "sharing_fraction_of_dfs": 0.97}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_workload(setup: str, density: float, sharing: float, n: int, policies: tuple[str, ...], seed: int,
                 interference: float, figure10: bool) -> dict[str, Any]:
    """Mix one workload and run every policy on it: one unit of work for a worker process."""
    model_name, hardware_name, tp = SETUPS[setup]
    model, hardware = model_spec(model_name), HardwareSpec.resolve(hardware_name).scaled(tp)
    cost = CostModel(model, hardware)
    overlap = overlap_function("interference", interference)
    requests = mix(n, density, sharing, cost, seed)
    bound = workload_bound(requests, cost, overlap)
    runs, summaries = {}, {}
    for policy in policies:
        start, cpu = time.monotonic(), time.process_time()
        runs[policy] = simulate(requests, policy, model, hardware, overlap, seed=seed)
        summaries[policy] = {**summarise(runs[policy], bound), "sim_wall_seconds": round(time.monotonic() - start, 1),
                             "sim_cpu_seconds": round(time.process_time() - cpu, 1)}
    compare_to(summaries, runs, "dfs")
    return {"setup": setup, "target_density": density, "target_sharing": sharing, "requests": n,
            "density": round(bound.density, 3), "sharing": round(bound.sharing, 3), "policies": summaries,
            "figure10": {policy: [values.tolist() for values in binned(runs[policy])] for policy in FIGURE10_POLICIES}
            if figure10 else None}


def _run_all(tasks: list[dict[str, Any]], jobs: int) -> list[dict[str, Any]]:
    def describe(result: dict[str, Any]) -> str:
        blend = result["policies"]["blendserve"]
        return (f"{result['setup']} density {result['target_density']} sharing {result['target_sharing']} "
                f"n={result['requests']}: blendserve {blend['speedup_over_dfs']:.3f}x dfs, "
                f"{blend['fraction_of_t_o']:.3f} of T_o, sim {blend['sim_wall_seconds']} s wall "
                f"({blend['sim_cpu_seconds']} s CPU)")

    if jobs <= 1:
        results = []
        for task in tasks:
            results.append(run_workload(**task))
            _log(describe(results[-1]))
        return results
    with ProcessPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_workload, **task) for task in tasks]
        results = []
        for future in futures:
            results.append(future.result())
            _log(describe(results[-1]))
        return results


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def markdown(report: dict) -> str:
    traces, grid = report["traces"], report["grid"]
    lines = [f"Overlap `{report['overlap']}`; {report['trace_requests']} requests per trace, "
             f"{report['grid_requests']} per grid workload; token budget {report['token_budget']}.", "",
             "| setup | trace | density | sharing | BlendServe / DFS | LPM / DFS | FCFS / DFS | Random / DFS "
             "| BlendServe of T_o | DFS of T_o | BlendServe sharing / DFS | BlendServe sim CPU / wall (s) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in traces:
        p = row["policies"]
        lines.append(f"| {row['setup']} | {row['trace']} | {row['density']} | {row['sharing']} | "
                     f"{p['blendserve']['speedup_over_dfs']:.3f} | {p['lpm']['speedup_over_dfs']:.3f} | "
                     f"{p['fcfs']['speedup_over_dfs']:.3f} | {p['random']['speedup_over_dfs']:.3f} | "
                     f"{p['blendserve']['fraction_of_t_o']:.3f} | {p['dfs']['fraction_of_t_o']:.3f} | "
                     f"{p['blendserve']['sharing_fraction_of_dfs']:.3f} | "
                     f"{p['blendserve']['sim_cpu_seconds']} / {p['blendserve']['sim_wall_seconds']} |")
    rows = [row["policies"] for row in traces]
    speedups = [cell["policies"]["blendserve"]["speedup_over_dfs"] for cell in grid]
    sharing = [row["blendserve"]["sharing_fraction_of_dfs"] for row in rows] + \
              [cell["policies"]["blendserve"]["sharing_fraction_of_dfs"] for cell in grid]
    lines += ["", "| metric | paper | ours | target |", "| --- | --- | --- | --- |",
              f"| BlendServe fraction of T_o (traces, mean) | {PAPER['blendserve_fraction_of_t_o']} | "
              f"{_mean([r['blendserve']['fraction_of_t_o'] for r in rows]):.3f} | >= 0.88 |",
              f"| BlendServe over DFS (traces, mean) | {PAPER['speedup_over_nanoflow_dfs']} (over NanoFlow-DFS) | "
              f"{_mean([r['blendserve']['speedup_over_dfs'] for r in rows]):.3f} | >= 1.15 |",
              f"| grid mean speedup over DFS | {PAPER['grid_mean_speedup']} | {_mean(speedups):.3f} | >= 1.2 |",
              f"| grid min / max speedup | {PAPER['grid_min_speedup']} / {PAPER['grid_max_speedup']} | "
              f"{min(speedups):.3f} / {max(speedups):.3f} | min >= 1.0 |",
              f"| BlendServe sharing / DFS (min over all) | {PAPER['sharing_fraction_of_dfs']} | {min(sharing):.3f} "
              f"| >= 0.97 |",
              f"| slowest simulation of a trace, CPU / wall (s) | | "
              f"{max(p['sim_cpu_seconds'] for r in rows for p in r.values())} / "
              f"{max(p['sim_wall_seconds'] for r in rows for p in r.values())} | <= 600 at 400K |"]
    return "\n".join(lines) + "\n"


def heatmap(grid: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speedup = {(cell["target_density"], cell["target_sharing"]): cell["policies"]["blendserve"]["speedup_over_dfs"]
               for cell in grid}
    values = np.array([[speedup[(d, s)] for d in GRID_DENSITIES] for s in GRID_SHARINGS])
    fig, axis = plt.subplots(figsize=(10, 3.6))
    image = axis.imshow(values, cmap="RdYlGn", vmin=0.8, vmax=1.6, aspect="auto", origin="lower")
    axis.set_xticks(range(len(GRID_DENSITIES)), [str(d) for d in GRID_DENSITIES])
    axis.set_yticks(range(len(GRID_SHARINGS)), [str(s) for s in GRID_SHARINGS])
    axis.set_xlabel("compute density")
    axis.set_ylabel("prefix sharing")
    for row in range(len(GRID_SHARINGS)):
        for column in range(len(GRID_DENSITIES)):
            axis.text(column, row, f"{values[row, column]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(image, label="BlendServe / DFS throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20K-request traces and 5K-request grid workloads")
    parser.add_argument("--trace-n", type=int, default=None, help="requests per trace (default 400000)")
    parser.add_argument("--grid-n", type=int, default=None, help="requests per grid workload (default 40000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interference", type=float, default=TWO_STREAM_INTERFERENCE,
                        help="lambda, the weight of the smaller of compute and memory time (default "
                             f"{TWO_STREAM_INTERFERENCE}, the measured two-stream co-run; 0.24 is nanoflow-bound)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (each 400K trace needs ~3 GB)")
    parser.add_argument("--out", type=Path, default=RESULTS / "paper_reproduction.json")
    args = parser.parse_args()
    trace_n = args.trace_n or (20_000 if args.quick else 400_000)
    grid_n = args.grid_n or (5_000 if args.quick else 40_000)
    common = {"seed": args.seed, "interference": args.interference}
    start = time.monotonic()
    trace_tasks = [{"setup": setup, "density": density, "sharing": sharing, "n": trace_n,
                    "policies": TRACE_POLICIES, "figure10": setup == FIGURE10_SETUP and trace == FIGURE10_TRACE,
                    **common}
                   for setup in SETUPS for trace, (density, sharing) in TABLE2_TRACES.items()]
    traces = _run_all(trace_tasks, args.jobs)
    for row, trace in zip(traces, [trace for _setup in SETUPS for trace in TABLE2_TRACES]):
        row["trace"] = trace
    grid_tasks = [{"setup": FIGURE10_SETUP, "density": density, "sharing": sharing, "n": grid_n,
                   "policies": GRID_POLICIES, "figure10": False, **common}
                  for density in GRID_DENSITIES for sharing in GRID_SHARINGS]
    grid = _run_all(grid_tasks, args.jobs)
    figure10 = next(row.pop("figure10") for row in traces if row["figure10"])
    for row in traces + grid:
        row.pop("figure10", None)
    report = {"trace_requests": trace_n, "grid_requests": grid_n, "seed": args.seed,
              "overlap": overlap_function("interference", args.interference).name,
              "token_budget": EngineConfig().token_budget, "traces": traces, "grid": grid, "paper": PAPER,
              "seconds": round(time.monotonic() - start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    args.out.with_suffix(".md").write_text(table)
    heatmap(grid, args.out.with_name("paper_grid_heatmap.png"))
    plot_steps({policy: tuple(np.asarray(values) for values in series) for policy, series in figure10.items()},
               args.out.with_name("figure10_trace2.png"), "Trace#2, Llama-3.1-8B / A100-80G")
    print(table)


if __name__ == "__main__":
    main()
