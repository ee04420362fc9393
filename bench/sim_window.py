"""How much of the plan the engine must hold for BlendServe to blend: the runner's window, swept.

    python -m bench.sim_window --n 10000

run-batch and the Batch API feed the engine a window of the plan's lines, a multiple of the requests it
runs at once (`server.window.WINDOW_MULTIPLE`; `sim.feed.runner_window` sizes it as the runner does). The in-engine dual scan
partitions memory and paces admissions from what it holds (and, for the rest of each side, from
`Placement.after`), so a narrow window can starve one side. This runs each Table 2 trace and a
grid workload through the simulator's shipped path at several window multiples, and with the
whole batch handed over at once, on a stock SGLang server's limits on an 80 GB H100 (the measured
H100 profile prices forwards); BlendServe's throughput is reported over DFS's, whose order does not
depend on the window. Writes ``bench/results/sim_window.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from sgl_blend.core.cost_model import CostModel, HardwareSpec
from sgl_blend.server.window import WINDOW_MULTIPLE
from sgl_blend.sim.feed import runner_window
from sgl_blend.forward_time.overlap import hardware_overlap
from sgl_blend.sim.run import simulate
from sgl_blend.sim.sizing import stock_engine
from sgl_blend.workloads.mixer import named_workload

RESULTS = Path(__file__).parent / "results"
HARDWARE_PROFILE = RESULTS / "hw_h100.json"
WORKLOADS = ("trace1", "trace2", "trace3", "trace4", "1.1:0.25")
MULTIPLES = (WINDOW_MULTIPLE, 4, 8, 16)


def sweep(workload: str, n: int, seed: int) -> dict[str, Any]:
    engine = stock_engine("llama-3.1-8b", "h100", hardware=HardwareSpec.from_json(HARDWARE_PROFILE))
    overlap = hardware_overlap(engine.hardware)
    requests = named_workload(workload, n, CostModel(engine.model, engine.hardware), seed)
    base = runner_window(requests, engine.config, engine.config.kv_capacity) // WINDOW_MULTIPLE
    windows = {f"x{multiple}": base * multiple for multiple in MULTIPLES} | {"whole batch": len(requests)}

    def seconds(policy: str, window: int) -> float:
        return simulate(requests, policy, engine.model, engine.hardware, overlap, seed=seed, config=engine.config,
                        window=window).seconds

    dfs = seconds("dfs", windows[f"x{WINDOW_MULTIPLE}"])
    return {"workload": workload, "requests": n, "concurrent": base, "windows": windows, "dfs_seconds": dfs,
            "blendserve_over_dfs": {name: dfs / seconds("blendserve", window) for name, window in windows.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "sim_window.json")
    args = parser.parse_args()
    started = time.monotonic()
    rows = [sweep(workload, args.n, args.seed) for workload in args.workloads.split(",")]
    report = {"command": f"python -m bench.sim_window --n {args.n} --workloads {args.workloads}", "rows": rows,
              "seconds": round(time.monotonic() - started, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    names = list(rows[0]["blendserve_over_dfs"])
    lines = [f"BlendServe / DFS through the shipped path, {args.n} requests per workload, by the runner's window "
             f"(multiples of the requests the engine runs at once; x{WINDOW_MULTIPLE} is the runner's).", "",
             "| workload | runs at once | " + " | ".join(names) + " |", "| --- | --- |" + " --- |" * len(names)]
    for row in rows:
        lines.append(f"| {row['workload']} | {row['concurrent']} | "
                     + " | ".join(f"{row['blendserve_over_dfs'][name]:.3f}" for name in names) + " |")
    table = "\n".join(lines) + "\n"
    args.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
