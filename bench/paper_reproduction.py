"""BlendServe's simulated results, regenerated: the four Table 2 traces and the 65-workload grid.

    python -m bench.paper_reproduction            # 40K-request traces, 10K-request grid
    python -m bench.paper_reproduction --quick    # smaller, a few minutes

Every policy runs the same workload on the same simulated engine (``sgl_blend.sim``) and cost
model; only the admission order differs. Writes ``bench/results/paper_reproduction.json``, a
Markdown table with the paper's figures beside ours, a heat map of the grid's speedup over DFS,
and the Figure 10 step plot for Trace#2.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.workloads.mixer import TABLE2_TRACES, mix
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.sim.overlap import DEFAULT_INTERFERENCE, overlap_function
from sgl_blend.sim.plot import plot_steps
from sgl_blend.sim.run import simulate, summarise, workload_bound

RESULTS = Path(__file__).parent / "results"
SETUPS = {"llama-3.1-8b / a100-80g": ("llama-3.1-8b", "a100-80g"),
          "llama-3.1-70b / 8xa100-80g (TP=8)": ("llama-3.1-70b", "a100-80gx8")}
TRACE_POLICIES = ("dfs", "lpm", "fcfs", "blendserve")
DENSITIES = [round(0.80 + 0.05 * step, 2) for step in range(13)]
SHARINGS = [round(0.05 + 0.10 * step, 2) for step in range(5)]
PAPER = {"blendserve_fraction_of_t_o": 0.866, "speedup_over_nanoflow_dfs": 1.208, "grid_mean_speedup": 1.23,
         "sharing_fraction_of_dfs": 0.97}


def run_traces(n: int, overlap) -> tuple[dict, dict]:
    results: dict = {}
    step_runs = {}
    for setup, (model_name, hardware_name) in SETUPS.items():
        model, hardware = model_spec(model_name), HardwareSpec.resolve(hardware_name)
        cost = CostModel(model, hardware)
        for trace, (density, sharing) in TABLE2_TRACES.items():
            requests = mix(n, density, sharing, cost)
            bound = workload_bound(requests, cost)
            row = {"target_density": density, "target_sharing": sharing,
                   "density": round(bound["density"], 3), "sharing": round(bound["sharing"], 3)}
            runs = {policy: simulate(requests, policy, model, hardware, overlap) for policy in TRACE_POLICIES}
            for policy, result in runs.items():
                row[policy] = summarise(result, bound)
                row[policy]["speedup_over_dfs"] = round(runs["dfs"].seconds / result.seconds, 4)
                row[policy]["sharing_fraction_of_dfs"] = round(result.sharing_ratio / runs["dfs"].sharing_ratio, 4) \
                    if runs["dfs"].sharing_ratio else 1.0
            results.setdefault(setup, {})[trace] = row
            if trace == "trace2" and setup.startswith("llama-3.1-8b"):
                step_runs = {policy: runs[policy] for policy in ("dfs", "blendserve")}
            print(f"{setup} {trace}: blendserve {row['blendserve']['speedup_over_dfs']:.3f}x dfs, "
                  f"{row['blendserve']['fraction_of_t_o']:.3f} of T_o", flush=True)
    return results, step_runs


def run_grid(n: int, overlap) -> list[dict]:
    model, hardware = model_spec("llama-3.1-8b"), HardwareSpec.resolve("a100-80g")
    cost = CostModel(model, hardware)
    cells = []
    for density in DENSITIES:
        for sharing in SHARINGS:
            requests = mix(n, density, sharing, cost)
            dfs = simulate(requests, "dfs", model, hardware, overlap)
            blend = simulate(requests, "blendserve", model, hardware, overlap)
            cells.append({"density": density, "sharing": sharing, "speedup_over_dfs": round(dfs.seconds / blend.seconds, 4),
                          "sharing_fraction_of_dfs": round(blend.sharing_ratio / dfs.sharing_ratio, 4) if dfs.sharing_ratio else 1.0})
        print(f"grid density {density}: done", flush=True)
    return cells


def markdown(traces: dict, grid: list[dict], overlap_name: str) -> str:
    lines = [f"Overlap function: `{overlap_name}`.", "",
             "| setup | trace | density | sharing | BlendServe / DFS | LPM / DFS | FCFS / DFS | BlendServe of T_o | DFS of T_o | sharing vs DFS |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setup, rows in traces.items():
        for trace, row in rows.items():
            lines.append(f"| {setup} | {trace} | {row['density']} | {row['sharing']} | "
                         f"{row['blendserve']['speedup_over_dfs']:.3f} | {row['lpm']['speedup_over_dfs']:.3f} | "
                         f"{row['fcfs']['speedup_over_dfs']:.3f} | {row['blendserve']['fraction_of_t_o']:.3f} | "
                         f"{row['dfs']['fraction_of_t_o']:.3f} | {row['blendserve']['sharing_fraction_of_dfs']:.3f} |")
    speedups = [cell["speedup_over_dfs"] for cell in grid]
    blend_to = [row["blendserve"]["fraction_of_t_o"] for rows in traces.values() for row in rows.values()]
    blend_dfs = [row["blendserve"]["speedup_over_dfs"] for rows in traces.values() for row in rows.values()]
    lines += ["", "| metric | paper | ours |", "| --- | --- | --- |",
              f"| BlendServe fraction of T_o (traces, mean) | {PAPER['blendserve_fraction_of_t_o']} | {sum(blend_to) / len(blend_to):.3f} |",
              f"| BlendServe over DFS (traces, mean) | {PAPER['speedup_over_nanoflow_dfs']} (over NanoFlow-DFS) | {sum(blend_dfs) / len(blend_dfs):.3f} |",
              f"| grid mean speedup over DFS | {PAPER['grid_mean_speedup']} | {sum(speedups) / len(speedups):.3f} |",
              f"| grid min / max speedup | 1.14 / 1.34 | {min(speedups):.3f} / {max(speedups):.3f} |",
              f"| sharing vs DFS (grid, min) | {PAPER['sharing_fraction_of_dfs']} | {min(c['sharing_fraction_of_dfs'] for c in grid):.3f} |"]
    return "\n".join(lines) + "\n"


def heatmap(grid: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    values = np.array([[next(c["speedup_over_dfs"] for c in grid if c["density"] == d and c["sharing"] == s)
                        for d in DENSITIES] for s in SHARINGS])
    fig, axis = plt.subplots(figsize=(10, 3.6))
    image = axis.imshow(values, cmap="RdYlGn", vmin=0.8, vmax=1.4, aspect="auto", origin="lower")
    axis.set_xticks(range(len(DENSITIES)), [str(d) for d in DENSITIES])
    axis.set_yticks(range(len(SHARINGS)), [str(s) for s in SHARINGS])
    axis.set_xlabel("compute density")
    axis.set_ylabel("prefix sharing")
    for row in range(len(SHARINGS)):
        for column in range(len(DENSITIES)):
            axis.text(column, row, f"{values[row, column]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(image, label="BlendServe / DFS throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10K-request traces and a 2K-request grid")
    parser.add_argument("--trace-n", type=int, default=None)
    parser.add_argument("--grid-n", type=int, default=None)
    parser.add_argument("--interference", type=float, default=DEFAULT_INTERFERENCE)
    parser.add_argument("--out", type=Path, default=RESULTS / "paper_reproduction.json")
    args = parser.parse_args()
    trace_n = args.trace_n or (10_000 if args.quick else 40_000)
    grid_n = args.grid_n or (2_000 if args.quick else 10_000)
    overlap = overlap_function("interference", args.interference)
    start = time.monotonic()
    traces, step_runs = run_traces(trace_n, overlap)
    grid = run_grid(grid_n, overlap)
    report = {"trace_requests": trace_n, "grid_requests": grid_n, "overlap": overlap.name, "traces": traces,
              "grid": grid, "paper": PAPER, "seconds": round(time.monotonic() - start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(traces, grid, overlap.name)
    args.out.with_suffix(".md").write_text(table)
    heatmap(grid, args.out.with_name("paper_grid_heatmap.png"))
    plot_steps(step_runs, args.out.with_name("figure10_trace2.png"), "Trace#2, Llama-3.1-8B / A100-80G")
    print(table)


if __name__ == "__main__":
    main()
