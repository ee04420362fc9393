"""The paper's workloads as batch files, run by run-batch on the emulated H100 and by the simulator.

`bench.sim_vs_emulated` and `bench.estimate_check` compare the two on the same file: the batch
file is written once per (workload, lines, seed) with `workloads.paper_lines` (prompts that
tokenise to the workload's exact lengths in the stand-in's tokenizer, ``ignore_eos`` outputs), the
emulated run is ``sgl-blend run-batch --emulate h100 --model llama-3.1-8b`` as a user runs it (a
fresh server per run, under the shared CPU lock), and the simulated run reads the same file
through `sim.batch_file` onto `sim.sizing`'s stock engine of the same device.

The emulated engine's batches are read back from SGLang's own log (its ``Decode batch`` lines
give the running and queued requests every ``--decode-log-interval`` forwards): how full the
engine was kept is what separates a feed-bound emulated run from the simulator, which assumes
the runner keeps its window full.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.shipped_path import REALTIME_FACTOR
from sgl_blend.core.cost_model import CostModel
from sgl_blend.sim.batch_file import load_batch_file, served_tokenizer
from sgl_blend.forward_time.overlap import hardware_overlap
from sgl_blend.sim.run import simulate
from sgl_blend.sim.sizing import StockEngine, stock_engine
from sgl_blend.workloads.paper_lines import paper_lines

MODEL = "llama-3.1-8b"
DEVICE = "h100"
CPU_LOCK = "/tmp/sglblend-cpu.lock"
_DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+).*#queue-req: (\d+)")


def engine() -> StockEngine:
    return stock_engine(MODEL, DEVICE)


def batch_file(workload: str, n: int, seed: int, folder: Path) -> Path:
    """The workload's batch file (written once; the same arguments give the same file)."""
    path = folder / f"{workload.replace(':', '_')}_{n}_s{seed}.jsonl"
    if not path.exists():
        stock = engine()
        lines = paper_lines(workload, n, CostModel(stock.model, stock.hardware), served_tokenizer(MODEL), seed)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@dataclass(frozen=True)
class EmulatedRun:
    summary: dict[str, Any]
    wall_seconds: float
    mean_running: float
    mean_queued: float


def run_emulated(path: Path, policy: str, folder: Path, reuse: bool = False) -> EmulatedRun:
    """``sgl-blend run-batch --emulate`` on ``path`` with a fresh server; its summary JSON. With
    ``reuse``, a run of the same file and policy already in ``folder`` is read back instead (the
    two benches share their emulated runs)."""
    out = folder / f"{path.stem}.{policy}.out.jsonl"
    summary_path, log = out.with_suffix(".summary.json"), out.with_suffix(".server.log")
    started = time.monotonic()
    if not (reuse and summary_path.exists()):
        for stale in folder.glob(f"{out.name}*"):
            subprocess.run(["rm", "-rf", str(stale)], check=True)
        summary_path.unlink(missing_ok=True)
        command = ["flock", CPU_LOCK, sys.executable, "-m", "sgl_blend.cli", "run-batch", "-i", str(path), "-o",
                   str(out), "--model", MODEL, "--emulate", DEVICE, "--policy", policy, "--summary-json",
                   str(summary_path), "--server-log", str(log), "--no-progress",
                   "--emulate-realtime", str(REALTIME_FACTOR)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    batches = [(int(running), int(queued)) for running, queued in _DECODE_LINE.findall(log.read_text())]
    return EmulatedRun(json.loads(summary_path.read_text()), time.monotonic() - started,
                       statistics.fmean(running for running, _ in batches) if batches else 0.0,
                       statistics.fmean(queued for _, queued in batches) if batches else 0.0)


def run_simulated(path: Path, policy: str) -> dict[str, Any]:
    """The simulator's run of the same file on the same device."""
    stock = engine()
    requests = load_batch_file(path, MODEL).requests
    started = time.monotonic()
    result = simulate(requests, policy, stock.model, stock.hardware, hardware_overlap(stock.hardware),
                      config=stock.config)
    decodes = result.output_tokens - len(requests)  # the first token of each comes with its prefill
    return {"seconds": result.seconds, "cached_tokens": result.cached_tokens, "iterations": result.iterations,
            "prompt_tokens": result.prompt_tokens, "output_tokens": result.output_tokens,
            "mean_decodes_per_iteration": decodes / result.iterations if result.iterations else 0.0,
            "wall_seconds": round(time.monotonic() - started, 2)}


def comparison_arguments(description: str, policies: str, out: Path) -> argparse.Namespace:
    """The command line `bench.sim_vs_emulated` and `bench.estimate_check` share (they share their
    emulated runs through ``--work-dir`` and ``--reuse``), parsed; the work folder made."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workloads", default="trace1,trace2")
    parser.add_argument("--n", type=int, default=2000, help="lines per workload")
    parser.add_argument("--policies", default=policies)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/sgl-blend-sim-vs-emulated"))
    parser.add_argument("--reuse", action="store_true",
                        help="read back emulated runs of the same file and policy already in --work-dir")
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    return args
