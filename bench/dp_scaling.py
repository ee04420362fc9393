"""DP scaling in the simulator (paper §5.5, Table 3): one Table 2 trace cut into k shares by
BlendServe's DP partition, each share simulated on its own device; throughput over one device.

Each rank is an A100 running Llama-3.1-8B with BlendServe, as in the paper's Table 3. A k-rank run
takes as long as its slowest share, so the speedup is T(1) / max_i T(share_i); below k it is the
price of imbalance (predicted work is not simulated time) and of the sharing each cut loses,
which the partition reports per cut. ``--contiguous`` also runs the one-slice-per-rank cut, whose
shares lose the compute/memory blend.

    python -m bench.dp_scaling --requests 2000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from sgl_blend.workloads.mixer import TABLE2_TRACES, mix
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.dp_shares import WorkItem, plan_shares
from sgl_blend.forward_time.overlap import hardware_overlap
from sgl_blend.sim.run import simulate

RESULTS = Path(__file__).parent / "results"
RANKS = (1, 2, 4, 8)
PAPER_TABLE3 = {"trace1": {2: 1.85, 4: 3.78}, "trace2": {2: 1.93, 4: 3.86},
                "trace3": {2: 1.85, 4: 3.81}, "trace4": {2: 1.93, 4: 3.88}}


def scale_trace(trace: str, n: int, ranks: tuple[int, ...], seed: int, contiguous: bool) -> dict[str, Any]:
    model, hardware = model_spec("llama-3.1-8b"), HardwareSpec.resolve("a100-80g")
    cost = CostModel(model, hardware)
    overlap = hardware_overlap(hardware)
    requests = mix(n, *TABLE2_TRACES[trace], cost, seed)
    items = [WorkItem(index, request.prompt_ids(), request.max_new_tokens, request.exact)
             for index, request in enumerate(requests)]
    rows: dict[str, Any] = {}
    single = None
    for k in ranks:
        for cut in ("blend", "contiguous") if contiguous and k > 1 else ("blend",):
            start = time.monotonic()
            shares = plan_shares(items, k, cost, contiguous=cut == "contiguous")
            runs = [simulate([requests[index] for index in share], "blendserve", model, hardware, overlap, seed=seed)
                    for share in shares.shares if share]
            seconds = max(run.seconds for run in runs)
            single = single or seconds
            tokens = sum(run.prompt_tokens + run.output_tokens for run in runs)
            cached = sum(run.cached_tokens for run in runs)
            prompt = sum(run.prompt_tokens for run in runs)
            rows[f"{k}" if cut == "blend" else f"{k}-contiguous"] = {
                "ranks": k, "cut": cut, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
                "speedup": round(single / seconds, 3), "per_rank_seconds": [round(run.seconds, 3) for run in runs],
                "predicted_imbalance": round(shares.imbalance(), 4),
                "lost_tokens_per_cut": shares.lost_tokens_per_cut,
                "lost_fraction_of_sharing": round(shares.lost_fraction(), 5),
                "sharing_ratio": round(cached / prompt, 4) if prompt else 0.0,
                "paper_speedup": PAPER_TABLE3[trace].get(k) if cut == "blend" else None,
                "wall_seconds": round(time.monotonic() - start, 1)}
            print(f"{trace} k={k} {cut}: {rows[list(rows)[-1]]['speedup']}x", flush=True)
    return rows


def markdown(report: dict[str, Any]) -> str:
    ranks = report["ranks"]
    lines = ["| trace | " + " | ".join(f"{k} ranks" for k in ranks) + " | sharing lost per cut (k=2 / 4 / 8) |",
             "|---|" + "---|" * (len(ranks) + 1)]
    for trace, rows in report["traces"].items():
        cells = []
        for k in ranks:
            row = rows[str(k)]
            paper = f" (paper {row['paper_speedup']}x)" if row["paper_speedup"] else ""
            cells.append(f"{row['speedup']:.2f}x{paper}")
        lost = " / ".join(f"{100 * rows[str(k)]['lost_fraction_of_sharing'] / max(k - 1, 1):.2f}%"
                          for k in ranks if k > 1)
        lines.append(f"| {trace} | " + " | ".join(cells) + f" | {lost} |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    ranks = report["ranks"]
    axis.plot(ranks, ranks, "k:", label="linear")
    for trace, rows in report["traces"].items():
        axis.plot(ranks, [rows[str(k)]["speedup"] for k in ranks], "o-", label=trace)
        paper = [(k, speedup) for k, speedup in PAPER_TABLE3[trace].items()]
        axis.plot([k for k, _ in paper], [s for _, s in paper], "x", color=axis.lines[-1].get_color())
    axis.set_xlabel("DP ranks (A100, Llama-3.1-8B each)")
    axis.set_ylabel("throughput over 1 rank")
    axis.set_title("BlendServe DP scaling, simulated (x: paper Table 3)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per trace")
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)))
    parser.add_argument("--traces", default=",".join(TABLE2_TRACES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--contiguous", action="store_true", help="also run the one-slice-per-rank cut")
    parser.add_argument("--out", type=Path, default=RESULTS / "dp_scaling.json")
    args = parser.parse_args()
    ranks = tuple(int(k) for k in args.ranks.split(","))
    start = time.monotonic()
    report = {"requests": args.requests, "ranks": list(ranks), "setup": "llama-3.1-8b / a100-80g per rank",
              "traces": {trace: scale_trace(trace, args.requests, ranks, args.seed, args.contiguous)
                         for trace in args.traces.split(",")}}
    report["seconds"] = round(time.monotonic() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    plot(report, args.out.with_suffix(".png"))
    print(markdown(report))


if __name__ == "__main__":
    main()
