"""Where BlendServe's simulated gain comes from: ordering alone, pacing alone, or both.

    python -m bench.sim_ablation                 # Table 2 traces + a 3x3 density x sharing grid
    python -m bench.sim_ablation --n 2000 --grid-n 1000 --chunks 2048,128   # a quick look

Every policy runs the same workload on the same simulated engine, at each of the same prefill
chunks (the engine's ``token_budget``, shared with decodes by `prefill_room`), and is reported at
each chunk and at its own best chunk, so no policy wins by a chunk the others were denied:

- ``dfs``: DFS order, no pacing (SGLang / NanoFlow-DFS);
- ``blendserve-order``: BlendServe's order (sort, split, dual scan), no pacing -- ordering alone;
- ``dfs+pacing``: DFS order with BlendServe's Alg. 3 prefill pacing -- pacing alone;
- ``blendserve``: order and pacing;
- ``fcfs-shuffled``: FCFS over a shuffled submission order (NanoFlow-Balance).

The device is the measured H100 profile (``bench/results/hw_h100.json``: achieved FLOP/s,
bandwidth, KV memory), iterations pay for their weight reads, and finished tails stay in the
radix cache. Each schedule is priced under both measured co-run settings at once (the schedule
never depends on time): lambda = 0.90, two CUDA streams, the default; lambda = 0.24,
``nanoflow-bound``, each op alone on its SM partition. ``T_o`` is the practical optimum under the
same lambda. The same schedules are also priced with no overlap (lambda = 1) to show how much of
any gain needs co-running kernels at all. Writes ``sim_ablation.json``, ``.md`` and ``.png``
under ``bench/results``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from sgl_blend.workloads.mixer import TABLE2_TRACES, mix
from sgl_blend.core.cost_model import (
    PARTITION_BOUND_INTERFERENCE, TWO_STREAM_INTERFERENCE, CostModel, HardwareSpec, model_spec,
)
from sgl_blend.sim.engine import EngineConfig
from sgl_blend.sim.metrics import workload_bound
from sgl_blend.forward_time.overlap import overlap_function
from sgl_blend.sim.run import simulate

RESULTS = Path(__file__).parent / "results"
HARDWARE_PROFILE = RESULTS / "hw_h100.json"
MODEL = "llama-3.1-8b"
POLICIES = ("dfs", "blendserve-order", "dfs+pacing", "blendserve", "fcfs-shuffled")
CHUNKS = (2048, 512, 128)
# The two measured co-run settings, and a counterfactual pricing of the same schedules with no
# kernel overlap at all (lambda = 1, ``T = comp + mem``): whatever gain survives there comes from
# batch composition -- prefill filling weight-bound decode steps -- not from co-running kernels.
LAMBDAS = {"two-stream": TWO_STREAM_INTERFERENCE, "nanoflow-bound": PARTITION_BOUND_INTERFERENCE, "no-overlap": 1.0}
MEASURED = ("two-stream", "nanoflow-bound")
GRID = tuple((density, sharing) for density in (0.8, 1.1, 1.4) for sharing in (0.05, 0.25, 0.45))
# The paper's figures (ASPLOS'26 text): Llama-3-8B end-to-end gains over NanoFlow-DFS are 19.34%
# to 22.65% across Table 2's traces (mean 20.84%; per-trace values are only in Figure 7); up to
# 1.44x over vLLM/SGLang-DFS; 86.55% of practical optimal on average; the simulated 65-workload
# grid averages 1.23x (22.53% in §6.5) over NanoFlow-DFS, 1.14x to 1.34x.
PAPER = {"trace_speedup_over_nanoflow_dfs": "1.19-1.23 (mean 1.21)", "speedup_over_sglang_dfs_max": 1.44,
         "fraction_of_t_o": 0.866, "grid_mean_speedup": 1.23, "grid_range": "1.14-1.34"}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_workload(label: str, density: float, sharing: float, n: int, chunks: tuple[int, ...], seed: int,
                 hardware: HardwareSpec) -> dict[str, Any]:
    """Every policy at every chunk on one workload, priced under both lambdas."""
    model = model_spec(MODEL)
    cost = CostModel(model, hardware)
    overlaps = {name: overlap_function("interference", value) for name, value in LAMBDAS.items()}
    primary, *others = overlaps.values()
    requests = mix(n, density, sharing, cost, seed)
    bounds = {name: workload_bound(requests, cost, overlap) for name, overlap in overlaps.items()}
    runs: dict[str, dict[str, Any]] = {}
    for policy in POLICIES:
        for chunk in chunks:
            start = time.monotonic()
            result = simulate(requests, policy, model, hardware, primary, seed=seed,
                              config=EngineConfig(token_budget=chunk), also_price=others)
            runs.setdefault(policy, {})[str(chunk)] = {
                "seconds": {name: result.seconds_under[overlap.name] for name, overlap in overlaps.items()},
                "sharing": round(result.sharing_ratio, 4), "retractions": result.retractions,
                "iterations": result.iterations, "wall_seconds": round(time.monotonic() - start, 2)}
    bound = next(iter(bounds.values()))
    row = {"workload": label, "target_density": density, "target_sharing": sharing, "requests": len(requests),
           "density": round(bound.density, 3), "max_sharing": round(bound.sharing, 4),
           "t_o": {name: b.t_o for name, b in bounds.items()}, "runs": runs}
    row["summary"] = {name: summarise(row, name, chunks) for name in LAMBDAS}
    return row


def summarise(row: dict[str, Any], lam: str, chunks: tuple[int, ...]) -> dict[str, Any]:
    """Per policy under one lambda: its best chunk, time there, speedup over DFS at DFS's best
    chunk, fraction of ``T_o``, and its speedup over DFS at each chunk."""
    runs, t_o = row["runs"], row["t_o"][lam]
    seconds = {policy: {chunk: runs[policy][str(chunk)]["seconds"][lam] for chunk in chunks} for policy in runs}
    best = {policy: min(chunks, key=lambda chunk: times[chunk]) for policy, times in seconds.items()}
    dfs = seconds["dfs"][best["dfs"]]
    out = {}
    for policy, times in seconds.items():
        at_best = times[best[policy]]
        out[policy] = {"best_chunk": best[policy], "speedup_over_dfs": round(dfs / at_best, 4),
                       "fraction_of_t_o": round(t_o / at_best, 4),
                       "sharing": runs[policy][str(best[policy])]["sharing"],
                       "speedup_over_dfs_same_chunk": {str(chunk): round(seconds["dfs"][chunk] / times[chunk], 4)
                                                       for chunk in chunks}}
    out["blendserve"]["speedup_over_dfs_pacing"] = round(
        seconds["dfs+pacing"][best["dfs+pacing"]] / seconds["blendserve"][best["blendserve"]], 4)
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _cell(summary: dict[str, Any], policy: str) -> str:
    entry = summary[policy]
    return f"{entry['speedup_over_dfs']:.3f} / {entry['fraction_of_t_o']:.3f} ({entry['best_chunk']})"


def markdown(report: dict[str, Any]) -> str:
    rows = report["traces"] + report["grid"]
    lines = [
        f"Simulated on {report['model']} / {report['hardware']} (measured profile), "
        f"{report['trace_requests']} requests per trace, {report['grid_requests']} per grid workload "
        f"(grid subset: density {{0.8, 1.1, 1.4}} x sharing {{0.05, 0.25, 0.45}}, 9 of the paper's 65), "
        f"seed {report['seed']}, prefill chunks {', '.join(map(str, report['chunks']))} swept for every policy.",
        f"Command: `{report['command']}`; runtime {report['seconds']:.0f} s with 1 job.", "",
        "Each cell: throughput / DFS's throughput at DFS's best chunk, then fraction of the practical "
        "optimum T_o under the same lambda, then (the policy's best chunk). Order = blendserve-order "
        "(BlendServe's order, no pacing); Pacing = dfs+pacing (DFS order, Alg. 3 pacing); Both = blendserve. "
        "BS / DFS+pacing: BlendServe over DFS given the same pacing; BS / Order: what pacing adds to the order.", "",
        "| workload | density / max sharing | lambda | DFS of T_o (chunk) | Order | Pacing | Both | FCFS-shuffled "
        "| BS / DFS+pacing | BS / Order | BS sharing / DFS | paper BS / DFS |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        paper = PAPER["trace_speedup_over_nanoflow_dfs"] if row["workload"].startswith("trace") else \
            f"grid mean {PAPER['grid_mean_speedup']}"
        for lam in LAMBDAS:
            s = row["summary"][lam]
            dfs_sharing = s["dfs"]["sharing"]
            over_order = s["blendserve"]["speedup_over_dfs"] / s["blendserve-order"]["speedup_over_dfs"]
            lines.append(
                f"| {row['workload']} | {row['density']} / {row['max_sharing']} | {lam} ({LAMBDAS[lam]}) | "
                f"{s['dfs']['fraction_of_t_o']:.3f} ({s['dfs']['best_chunk']}) | {_cell(s, 'blendserve-order')} | "
                f"{_cell(s, 'dfs+pacing')} | {_cell(s, 'blendserve')} | {_cell(s, 'fcfs-shuffled')} | "
                f"{s['blendserve']['speedup_over_dfs_pacing']:.3f} | {over_order:.3f} | "
                f"{s['blendserve']['sharing'] / dfs_sharing if dfs_sharing else 1.0:.3f} | {paper} |")
    lines += ["", "Aggregates (each policy at its best chunk; speedups over DFS at its best chunk):", "",
              "| lambda | set | Order (mean) | Pacing (mean) | Both (mean, min-max) | FCFS-shuffled (mean) "
              "| BS / DFS+pacing (mean, min-max) | BS / Order (mean) | BS of T_o (mean) | DFS of T_o (mean) | paper |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for lam in LAMBDAS:
        for name, subset, paper in (("traces", report["traces"], f"{PAPER['trace_speedup_over_nanoflow_dfs']} "
                                     f"over NanoFlow-DFS (up to {PAPER['speedup_over_sglang_dfs_max']} over "
                                     f"SGLang-DFS), {PAPER['fraction_of_t_o']} of T_o"),
                                    ("grid subset", report["grid"], f"{PAPER['grid_mean_speedup']} mean, "
                                     f"{PAPER['grid_range']}")):
            if not subset:
                continue
            s = [row["summary"][lam] for row in subset]
            both = [x["blendserve"]["speedup_over_dfs"] for x in s]
            vs_paced = [x["blendserve"]["speedup_over_dfs_pacing"] for x in s]
            vs_order = [x["blendserve"]["speedup_over_dfs"] / x["blendserve-order"]["speedup_over_dfs"] for x in s]
            lines.append(
                f"| {lam} ({LAMBDAS[lam]}) | {name} | {_mean([x['blendserve-order']['speedup_over_dfs'] for x in s]):.3f} | "
                f"{_mean([x['dfs+pacing']['speedup_over_dfs'] for x in s]):.3f} | {_mean(both):.3f} "
                f"({min(both):.3f}-{max(both):.3f}) | {_mean([x['fcfs-shuffled']['speedup_over_dfs'] for x in s]):.3f} | "
                f"{_mean(vs_paced):.3f} ({min(vs_paced):.3f}-{max(vs_paced):.3f}) | {_mean(vs_order):.3f} | "
                f"{_mean([x['blendserve']['fraction_of_t_o'] for x in s]):.3f} | "
                f"{_mean([x['dfs']['fraction_of_t_o'] for x in s]):.3f} | {paper} |")
    lines += ["", *reading(report)]
    for lam in MEASURED:
        lines += ["", f"Per chunk, {lam} (lambda {LAMBDAS[lam]}): throughput over DFS at the same chunk.", "",
                  "| workload | chunk | " + " | ".join(POLICIES[1:]) + " |",
                  "| --- | --- |" + " --- |" * (len(POLICIES) - 1)]
        for row in rows:
            s = row["summary"][lam]
            for chunk in report["chunks"]:
                lines.append(f"| {row['workload']} | {chunk} | " + " | ".join(
                    f"{s[policy]['speedup_over_dfs_same_chunk'][str(chunk)]:.3f}" for policy in POLICIES[1:]) + " |")
    return "\n".join(lines) + "\n"


def reading(report: dict[str, Any]) -> list[str]:
    """The comparisons the table exists for, computed from it (traces and grid subset together)."""
    rows = report["traces"] + report["grid"]

    def mean(lam: str, key) -> float:
        return _mean([key(row["summary"][lam]) for row in rows])

    both = {lam: mean(lam, lambda s: s["blendserve"]["speedup_over_dfs"]) for lam in LAMBDAS}
    order = {lam: mean(lam, lambda s: s["blendserve-order"]["speedup_over_dfs"]) for lam in LAMBDAS}
    pacing = mean("two-stream", lambda s: s["dfs+pacing"]["speedup_over_dfs"])
    vs_paced = mean("two-stream", lambda s: s["blendserve"]["speedup_over_dfs_pacing"])
    shuffled = mean("two-stream", lambda s: s["fcfs-shuffled"]["speedup_over_dfs"])
    def iterations(row: dict[str, Any], policy: str) -> int:
        return row["runs"][policy][str(row["summary"]["two-stream"][policy]["best_chunk"])]["iterations"]

    stretch = _mean([iterations(row, "dfs+pacing") / iterations(row, "dfs") for row in rows])
    high_sharing = [row["summary"]["two-stream"] for row in report["traces"] if row["workload"] in ("trace1", "trace2")]
    balance = _mean([x["blendserve"]["speedup_over_dfs"] / x["fcfs-shuffled"]["speedup_over_dfs"] for x in high_sharing])
    wins = sum(1 for row in rows if row["summary"]["two-stream"]["blendserve"]["speedup_over_dfs"]
               > row["summary"]["two-stream"]["blendserve-order"]["speedup_over_dfs"])
    kept = (both["no-overlap"] - 1) / (both["two-stream"] - 1) if both["two-stream"] > 1 else float("nan")
    return ["Reading (means over all workloads above, each policy at its best chunk):", "",
            f"- BlendServe over DFS: {both['two-stream']:.3f}x at the measured two-stream lambda, "
            f"{both['nanoflow-bound']:.3f}x at nanoflow-bound; ordering alone (no pacing): "
            f"{order['two-stream']:.3f}x / {order['nanoflow-bound']:.3f}x. Pacing on top of the order wins on "
            f"{wins} of {len(rows)} workloads (two-stream).",
            f"- Pacing alone (DFS order + Alg. 3 pacing) is {pacing:.3f}x DFS: with the per-iteration prefill budget "
            f"DFS runs {stretch:.1f}x as many iterations for the same tokens, i.e. far smaller batches, each paying "
            f"the weight read. BlendServe beats DFS + the same pacing by {vs_paced:.3f}x, which measures that more "
            f"than BlendServe's order.",
            f"- Shuffled FCFS (NanoFlow-Balance) reaches {shuffled:.3f}x DFS at two-stream; on Trace#1 and #2 "
            f"BlendServe is {balance:.3f}x it (paper: 1.36x over NanoFlow-Balance there).",
            f"- Priced with no kernel overlap at all (lambda = 1) the same schedules still give {both['no-overlap']:.3f}x: "
            f"{kept:.0%} of the two-stream gain comes from batch composition -- prefill tokens filling decode steps "
            f"that would otherwise be bound by reading the weights -- not from co-running GEMM and attention."]


def plot(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = report["traces"] + report["grid"]
    labels = [row["workload"] for row in rows]
    shown = ("blendserve-order", "dfs+pacing", "blendserve", "fcfs-shuffled")
    fig, axes = plt.subplots(len(LAMBDAS), 1, figsize=(max(8, 0.9 * len(rows)), 3.2 * len(LAMBDAS)), squeeze=False)
    width = 0.8 / len(shown)
    for axis, lam in zip(axes[:, 0], LAMBDAS):
        positions = np.arange(len(rows))
        for k, policy in enumerate(shown):
            axis.bar(positions + (k - (len(shown) - 1) / 2) * width,
                     [row["summary"][lam][policy]["speedup_over_dfs"] for row in rows], width, label=policy)
        top = max(row["summary"][lam][policy]["speedup_over_dfs"] for row in rows for policy in shown)
        axis.set_ylim(0, max(top, PAPER["grid_mean_speedup"]) * 1.25)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.axhline(PAPER["grid_mean_speedup"], color="red", linestyle="--", linewidth=0.8, label="paper grid mean 1.23")
        axis.set_xticks(positions, labels, rotation=30, ha="right", fontsize=7)
        axis.set_ylabel(f"{lam} (lambda {LAMBDAS[lam]})\nthroughput / DFS")
        axis.legend(fontsize=7, ncol=5, loc="upper left")
    fig.suptitle("Ablation, each policy at its best prefill chunk")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=6000, help="requests per Table 2 trace")
    parser.add_argument("--grid-n", type=int, default=3000, help="requests per grid workload (0: no grid)")
    parser.add_argument("--chunks", default=",".join(map(str, CHUNKS)), help="prefill chunks swept for every policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hardware", default=str(HARDWARE_PROFILE))
    parser.add_argument("--out", type=Path, default=RESULTS / "sim_ablation.json")
    parser.add_argument("--render", action="store_true", help="only redraw the .md and .png from --out's JSON")
    args = parser.parse_args()
    if args.render:
        report = json.loads(args.out.read_text())
        args.out.with_suffix(".md").write_text(markdown(report))
        plot(report, args.out.with_suffix(".png"))
        print(markdown(report))
        return
    chunks = tuple(int(chunk) for chunk in args.chunks.split(","))
    hardware = HardwareSpec.resolve(args.hardware)
    # Policies see only whether blending pays (the profile's lambda < 1); both measured lambdas
    # agree on it, so one schedule stands for both. The no-overlap pricing is a counterfactual.
    if not all((LAMBDAS[name] < 1.0) == hardware.blending_pays for name in MEASURED):
        raise SystemExit("the policies' decisions depend on whether blending pays; the measured lambdas must agree")
    start = time.monotonic()
    traces, grid = [], []
    for trace, (density, sharing) in TABLE2_TRACES.items():
        traces.append(run_workload(trace, density, sharing, args.n, chunks, args.seed, hardware))
        _log(f"{trace}: {json.dumps({lam: traces[-1]['summary'][lam]['blendserve']['speedup_over_dfs'] for lam in LAMBDAS})} "
             f"at {time.monotonic() - start:.0f} s")
    if args.grid_n:
        for density, sharing in GRID:
            grid.append(run_workload(f"grid {density}/{sharing}", density, sharing, args.grid_n, chunks, args.seed,
                                     hardware))
            _log(f"grid {density}/{sharing} done at {time.monotonic() - start:.0f} s")
    report = {"model": MODEL, "hardware": hardware.name, "hardware_profile": args.hardware,
              "lambdas": LAMBDAS, "chunks": list(chunks), "policies": list(POLICIES), "seed": args.seed,
              "trace_requests": args.n, "grid_requests": args.grid_n,
              "command": "python -m bench.sim_ablation " + " ".join(sys.argv[1:]),
              "traces": traces, "grid": grid, "paper": PAPER, "seconds": round(time.monotonic() - start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    args.out.with_suffix(".md").write_text(table)
    plot(report, args.out.with_suffix(".png"))
    print(table)


if __name__ == "__main__":
    main()
