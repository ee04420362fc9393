"""The simulator against the emulated engine on the same batch files: one model of the engine.

    python -m bench.sim_vs_emulated --workloads trace1,trace2 --n 2000 --policies blendserve,dfs,lpm

For each paper workload at ``--n`` lines (`bench.sim_emulated_runs`: the same file for both) and
each policy, run-batch runs the file on the emulated H100 (Llama-3.1-8B shapes, a stock SGLang
server's limits) and the simulator runs it through the shipped path on the same limits and price.
The simulator predicts device time, so it is compared with the emulated run's device seconds (its
forwards) and with its job time (device plus idle). The target is within 5%. Alongside: prompt
tokens found cached, and how full each kept the engine (the emulated engine's mean running and
queued requests from SGLang's log, the simulator's mean decodes per iteration), which is where the
two part when the runner cannot keep the emulated engine's window full. Writes
``bench/results/sim_vs_emulated.{json,png}``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.sim_emulated_runs import DEVICE, MODEL, batch_file, comparison_arguments, run_emulated, run_simulated

RESULTS = Path(__file__).parent / "results"
TARGET = 0.05


def compare(workload: str, n: int, policy: str, seed: int, folder: Path, reuse: bool) -> dict[str, Any]:
    path = batch_file(workload, n, seed, folder)
    emulated = run_emulated(path, policy, folder, reuse)
    simulated = run_simulated(path, policy)
    summary = emulated.summary
    device, job = summary["device_seconds"], summary["seconds"]
    return {"workload": workload, "lines": n, "policy": policy,
            "emulated": {"seconds": job, "device_seconds": device, "idle_seconds": summary["idle_seconds"],
                         "cached_tokens": summary["cached_tokens"], "prompt_tokens": summary["prompt_tokens"],
                         "completion_tokens": summary["completion_tokens"], "wall_seconds": round(emulated.wall_seconds, 1),
                         "mean_running_requests": round(emulated.mean_running, 1),
                         "mean_queued_requests": round(emulated.mean_queued, 1)},
            "simulated": simulated,
            "sim_over_emulated_device": simulated["seconds"] / device,
            "sim_over_emulated_job": simulated["seconds"] / job,
            "within_target": abs(simulated["seconds"] / device - 1) <= TARGET}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [f"{row['workload']}\n{row['policy']}" for row in rows]
    positions = np.arange(len(rows))
    fig, axis = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    axis.bar(positions - 0.2, [row["emulated"]["device_seconds"] for row in rows], 0.4, label="emulated (device s)")
    axis.bar(positions + 0.2, [row["simulated"]["seconds"] for row in rows], 0.4, label="simulated")
    for position, row in zip(positions, rows):
        axis.text(position, max(row["emulated"]["device_seconds"], row["simulated"]["seconds"]),
                  f"{row['sim_over_emulated_device']:.2f}x", ha="center", va="bottom", fontsize=7)
    axis.set_xticks(positions, labels, fontsize=7)
    axis.set_ylabel("job seconds on the emulated H100")
    axis.set_title(f"Simulator vs emulated engine ({MODEL} on {DEVICE}); label: simulated / emulated")
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    args = comparison_arguments(__doc__.splitlines()[0], "blendserve,dfs,lpm", RESULTS / "sim_vs_emulated.json")
    started = time.monotonic()
    rows = [compare(workload, args.n, policy, args.seed, args.work_dir, args.reuse)
            for workload in args.workloads.split(",") for policy in args.policies.split(",")]
    report = {"command": "python -m bench.sim_vs_emulated --workloads {} --n {} --policies {}".format(
                  args.workloads, args.n, args.policies),
              "model": MODEL, "device": DEVICE, "target": TARGET, "rows": rows,
              "seconds": round(time.monotonic() - started, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(rows, args.out.with_suffix(".png"))
    for row in rows:
        emulated = row["emulated"]
        print(f"{row['workload']:>8} {row['policy']:>10}: emulated {emulated['device_seconds']:8.1f} s device "
              f"(+{emulated['idle_seconds']:.1f} idle), simulated {row['simulated']['seconds']:8.1f} s "
              f"-> {row['sim_over_emulated_device']:.3f}x; running {emulated['mean_running_requests']} "
              f"(queued {emulated['mean_queued_requests']}) vs sim decodes/iteration "
              f"{row['simulated']['mean_decodes_per_iteration']:.1f}")


if __name__ == "__main__":
    main()
