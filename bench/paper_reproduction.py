"""BlendServe's simulated results, regenerated: the four Table 2 traces and the 65-workload grid.

    python -m bench.paper_reproduction            # 40K-request traces and grid workloads
    python -m bench.paper_reproduction --quick    # 10K traces, 5K grid: a few minutes

Every policy runs the same workload on the same simulated engine (``sgl_blend.sim``) and cost
model; only the admission order differs. Traces run on Llama-3.1-8B / A100-80G and on
Llama-3.1-70B / 8xA100 (TP=8 as a hardware scale), each mixed with its own cost model as the
paper re-synthesises per model. Writes ``paper_reproduction.json``, a Markdown table with the
paper's figures beside ours, a heat map of the grid's speedup over DFS, and Figure 10 for Trace#2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.workloads.mixer import GRID_DENSITIES, GRID_SHARINGS, TABLE2_TRACES, mix
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.sim.engine import EngineConfig
from sgl_blend.sim.metrics import compare_to, summarise, workload_bound
from sgl_blend.sim.overlap import DEFAULT_INTERFERENCE, OverlapFunction, overlap_function
from sgl_blend.sim.plot import plot_steps
from sgl_blend.sim.run import simulate

RESULTS = Path(__file__).parent / "results"
SETUPS = {"llama-3.1-8b / a100-80g": ("llama-3.1-8b", "a100-80g", 1),
          "llama-3.1-70b / 8xa100-80g (TP=8)": ("llama-3.1-70b", "a100-80g", 8)}
TRACE_POLICIES = ("dfs", "lpm", "fcfs", "random", "blendserve")
PAPER = {"blendserve_fraction_of_t_o": 0.866, "speedup_over_nanoflow_dfs": 1.208, "grid_mean_speedup": 1.23,
         "grid_min_speedup": 1.14, "grid_max_speedup": 1.34, "sharing_fraction_of_dfs": 0.97}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_traces(n: int, overlap: OverlapFunction, seed: int) -> tuple[dict, dict]:
    results: dict = {}
    figure10 = {}
    for setup, (model_name, hardware_name, tp) in SETUPS.items():
        model, hardware = model_spec(model_name), HardwareSpec.resolve(hardware_name).scaled(tp)
        cost = CostModel(model, hardware)
        for trace, (density, sharing) in TABLE2_TRACES.items():
            requests = mix(n, density, sharing, cost, seed)
            bound = workload_bound(requests, cost, overlap)
            runs = {policy: simulate(requests, policy, model, hardware, overlap, seed=seed) for policy in TRACE_POLICIES}
            row = {"target_density": density, "target_sharing": sharing, "density": round(bound.density, 3),
                   "sharing": round(bound.sharing, 3), "policies": {p: summarise(r, bound) for p, r in runs.items()}}
            compare_to(row["policies"], runs, "dfs")
            results.setdefault(setup, {})[trace] = row
            if trace == "trace2" and tp == 1:
                figure10 = {policy: runs[policy] for policy in ("dfs", "random", "blendserve")}
            blend = row["policies"]["blendserve"]
            _log(f"{setup} {trace}: blendserve {blend['speedup_over_dfs']:.3f}x dfs, "
                 f"{blend['fraction_of_t_o']:.3f} of T_o")
    return results, figure10


def run_grid(n: int, overlap: OverlapFunction, seed: int) -> list[dict]:
    model, hardware = model_spec("llama-3.1-8b"), HardwareSpec.resolve("a100-80g")
    cost = CostModel(model, hardware)
    cells = []
    for density in GRID_DENSITIES:
        for sharing in GRID_SHARINGS:
            requests = mix(n, density, sharing, cost, seed)
            bound = workload_bound(requests, cost, overlap)
            runs = {policy: simulate(requests, policy, model, hardware, overlap, seed=seed)
                    for policy in ("dfs", "blendserve")}
            summary = {p: summarise(r, bound) for p, r in runs.items()}
            compare_to(summary, runs, "dfs")
            cells.append({"density": density, "sharing": sharing, "measured_density": round(bound.density, 3),
                          "measured_sharing": round(bound.sharing, 3),
                          "speedup_over_dfs": summary["blendserve"]["speedup_over_dfs"],
                          "sharing_fraction_of_dfs": summary["blendserve"]["sharing_fraction_of_dfs"],
                          "blendserve_fraction_of_t_o": summary["blendserve"]["fraction_of_t_o"],
                          "dfs_fraction_of_t_o": summary["dfs"]["fraction_of_t_o"]})
        _log(f"grid density {density}: done")
    return cells


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def markdown(report: dict) -> str:
    traces, grid = report["traces"], report["grid"]
    lines = [f"Overlap `{report['overlap']}`; {report['trace_requests']} requests per trace, "
             f"{report['grid_requests']} per grid workload; token budget {report['token_budget']}.", "",
             "| setup | trace | density | sharing | BlendServe / DFS | LPM / DFS | FCFS / DFS | Random / DFS "
             "| BlendServe of T_o | DFS of T_o | BlendServe sharing / DFS |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setup, rows in traces.items():
        for trace, row in rows.items():
            p = row["policies"]
            lines.append(f"| {setup} | {trace} | {row['density']} | {row['sharing']} | "
                         f"{p['blendserve']['speedup_over_dfs']:.3f} | {p['lpm']['speedup_over_dfs']:.3f} | "
                         f"{p['fcfs']['speedup_over_dfs']:.3f} | {p['random']['speedup_over_dfs']:.3f} | "
                         f"{p['blendserve']['fraction_of_t_o']:.3f} | {p['dfs']['fraction_of_t_o']:.3f} | "
                         f"{p['blendserve']['sharing_fraction_of_dfs']:.3f} |")
    rows = [row["policies"] for setup_rows in traces.values() for row in setup_rows.values()]
    speedups = [cell["speedup_over_dfs"] for cell in grid]
    sharing = [row["blendserve"]["sharing_fraction_of_dfs"] for row in rows] + \
              [cell["sharing_fraction_of_dfs"] for cell in grid]
    lines += ["", "| metric | paper | ours | target |", "| --- | --- | --- | --- |",
              f"| BlendServe fraction of T_o (traces, mean) | {PAPER['blendserve_fraction_of_t_o']} | "
              f"{_mean([r['blendserve']['fraction_of_t_o'] for r in rows]):.3f} | >= 0.88 |",
              f"| BlendServe over DFS (traces, mean) | {PAPER['speedup_over_nanoflow_dfs']} (over NanoFlow-DFS) | "
              f"{_mean([r['blendserve']['speedup_over_dfs'] for r in rows]):.3f} | >= 1.15 |",
              f"| grid mean speedup over DFS | {PAPER['grid_mean_speedup']} | {_mean(speedups):.3f} | >= 1.2 |",
              f"| grid min / max speedup | {PAPER['grid_min_speedup']} / {PAPER['grid_max_speedup']} | "
              f"{min(speedups):.3f} / {max(speedups):.3f} | min >= 1.0 |",
              f"| BlendServe sharing / DFS (min over all) | {PAPER['sharing_fraction_of_dfs']} | {min(sharing):.3f} "
              f"| >= 0.97 |"]
    return "\n".join(lines) + "\n"


def heatmap(grid: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    values = np.array([[next(c["speedup_over_dfs"] for c in grid if c["density"] == d and c["sharing"] == s)
                        for d in GRID_DENSITIES] for s in GRID_SHARINGS])
    fig, axis = plt.subplots(figsize=(10, 3.6))
    image = axis.imshow(values, cmap="RdYlGn", vmin=0.8, vmax=1.4, aspect="auto", origin="lower")
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
    parser.add_argument("--quick", action="store_true", help="10K-request traces and 5K-request grid workloads")
    parser.add_argument("--trace-n", type=int, default=None)
    parser.add_argument("--grid-n", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interference", type=float, default=DEFAULT_INTERFERENCE)
    parser.add_argument("--out", type=Path, default=RESULTS / "paper_reproduction.json")
    args = parser.parse_args()
    trace_n = args.trace_n or (10_000 if args.quick else 40_000)
    grid_n = args.grid_n or (5_000 if args.quick else 40_000)
    overlap = overlap_function("interference", args.interference)
    start = time.monotonic()
    traces, figure10 = run_traces(trace_n, overlap, args.seed)
    grid = run_grid(grid_n, overlap, args.seed)
    report = {"trace_requests": trace_n, "grid_requests": grid_n, "seed": args.seed, "overlap": overlap.name,
              "token_budget": EngineConfig().token_budget, "traces": traces, "grid": grid, "paper": PAPER,
              "seconds": round(time.monotonic() - start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    args.out.with_suffix(".md").write_text(table)
    heatmap(grid, args.out.with_name("paper_grid_heatmap.png"))
    plot_steps(figure10, args.out.with_name("figure10_trace2.png"), "Trace#2, Llama-3.1-8B / A100-80G")
    print(table)


if __name__ == "__main__":
    main()
