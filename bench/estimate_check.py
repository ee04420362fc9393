"""`sgl-blend estimate` against the emulated run of the same file: is the price right before running?

    python -m bench.estimate_check --workloads trace1,trace2 --n 2000 --policies blendserve,lpm

For each paper workload's batch file (`bench.sim_emulated_runs`), ``sgl-blend estimate --json``
prices it per policy -- on this CPU, in seconds -- and run-batch then runs it on the emulated H100.
The estimate's predicted job time is compared with the emulated job's time (device plus idle
seconds, what run-batch's summary reports) and with its device seconds alone; the target is
within 10% of the job time. Also compared: prompt tokens saved by sharing, and the order of the
policies (does the estimate pick the faster one). Writes ``bench/results/estimate_check.{json,png}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.sim_emulated_runs import DEVICE, MODEL, batch_file, comparison_arguments, run_emulated

RESULTS = Path(__file__).parent / "results"
TARGET = 0.10


def estimate(path: Path, policies: list[str]) -> tuple[dict[str, Any], float]:
    """The estimate command's report for ``path`` and the seconds it took."""
    started = time.monotonic()
    output = subprocess.run([sys.executable, "-m", "sgl_blend.cli", "estimate", "-i", str(path), "--model", MODEL,
                             "--device", DEVICE, "--policy", ",".join(policies), "--json"],
                            check=True, capture_output=True, text=True).stdout
    return json.loads(output), time.monotonic() - started


def check(workload: str, n: int, policies: list[str], seed: int, folder: Path, reuse: bool) -> dict[str, Any]:
    path = batch_file(workload, n, seed, folder)
    report, estimate_seconds = estimate(path, policies)
    rows = {}
    for policy in policies:
        predicted = report["policies"][policy]
        summary = run_emulated(path, policy, folder, reuse).summary
        rows[policy] = {"predicted_seconds": predicted["seconds"], "emulated_seconds": summary["seconds"],
                        "emulated_device_seconds": summary["device_seconds"],
                        "predicted_over_emulated": predicted["seconds"] / summary["seconds"],
                        "predicted_saved_prompt_tokens": predicted["saved_prompt_tokens"],
                        "emulated_cached_tokens": summary["cached_tokens"],
                        "within_target": abs(predicted["seconds"] / summary["seconds"] - 1) <= TARGET}
    fastest = {kind: min(rows, key=lambda policy: rows[policy][key])
               for kind, key in (("predicted", "predicted_seconds"), ("emulated", "emulated_seconds"))}
    return {"workload": workload, "lines": n, "estimate_seconds": round(estimate_seconds, 1),
            "t_o_seconds": report["bound"]["t_o_seconds"], "policies": rows,
            "fastest": fastest, "same_fastest": fastest["predicted"] == fastest["emulated"]}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(5.5, 5))
    top = 0.0
    for row in rows:
        for policy, entry in row["policies"].items():
            axis.scatter(entry["emulated_seconds"], entry["predicted_seconds"], label=f"{row['workload']} {policy}")
            top = max(top, entry["emulated_seconds"], entry["predicted_seconds"])
    line = [0, top * 1.05]
    axis.plot(line, line, color="black", linewidth=0.8)
    axis.fill_between(line, [x * (1 - TARGET) for x in line], [x * (1 + TARGET) for x in line], alpha=0.15,
                      label=f"within {TARGET:.0%}")
    axis.set_xlabel("emulated job seconds (run-batch --emulate)")
    axis.set_ylabel("predicted seconds (sgl-blend estimate)")
    axis.set_title(f"estimate vs emulated run, {MODEL} on {DEVICE}")
    axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    args = comparison_arguments(__doc__.splitlines()[0], "blendserve,lpm", RESULTS / "estimate_check.json")
    started = time.monotonic()
    rows = [check(workload, args.n, args.policies.split(","), args.seed, args.work_dir, args.reuse)
            for workload in args.workloads.split(",")]
    report = {"command": "python -m bench.estimate_check --workloads {} --n {} --policies {}".format(
                  args.workloads, args.n, args.policies),
              "model": MODEL, "device": DEVICE, "target": TARGET, "rows": rows,
              "seconds": round(time.monotonic() - started, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(rows, args.out.with_suffix(".png"))
    for row in rows:
        for policy, entry in row["policies"].items():
            print(f"{row['workload']:>8} {policy:>10}: predicted {entry['predicted_seconds']:8.1f} s, emulated "
                  f"{entry['emulated_seconds']:8.1f} s ({entry['emulated_device_seconds']:.1f} device) -> "
                  f"{entry['predicted_over_emulated']:.3f}x")
        print(f"{row['workload']:>8} fastest: predicted {row['fastest']['predicted']}, emulated {row['fastest']['emulated']}")


if __name__ == "__main__":
    main()
