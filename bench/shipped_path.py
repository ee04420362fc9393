"""BlendServe on the path users run, at paper scale, on an emulated H100 with Llama-3.1-8B's shapes.

Every run is `sgl-blend run-batch --emulate h100 --model llama-3.1-8b` on a fresh server: SGLang's
real tokenizer, scheduler (radix cache, chunked prefill, mixed batches, retraction) and the plugin,
the forward priced by the cost model, sized as a stock SGLang server on an 80 GB H100. Every policy
runs the same file with the same engine flags. Job time is the emulated device's: the priced
forwards plus the wall time the engine had nothing to run while lines remained, from the first
forward with offline work; each run also reports how far the host fell behind the device in real
time (``late_seconds``), and the job time with that lateness charged. A comparison in which any
run's lateness passes `LATE_SHARE` of its job says so.

Workloads are the paper's Table 2 traces and a 3x3 subset of its density x sharing grid
(`sgl_blend.workloads.paper_lines`), ``--lines`` each. For each run: tokens/s, cached prompt
tokens, the idle share of the job and its fraction of ``T_o = max((1 - s) T_comp, T_mem)``, the
bound of perfect overlap at the workload's sharing ratio. Results accumulate in the JSON (a
re-run skips what it holds), and the report compares BlendServe with DFS and with the best of
SGLang's own orders inside each workload.

    python -m bench.shipped_path --lines 4000
    python -m bench.shipped_path --lines 50000 --workloads trace2 --policies blendserve --rss
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil

from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec, optimal_time
from sgl_blend.core.prefix_tree import PrefixTree
from sgl_blend.models.registry import STAND_IN, prepare
from sgl_blend.workloads.batch_files import write_jsonl
from sgl_blend.workloads.paper_lines import paper_requests, request_line, one_token_words

RESULTS = Path(__file__).parent / "results"
MODEL, DEVICE, HARDWARE = "llama-3.1-8b", "h100", "h100-sxm"
TRACES = ("trace1", "trace2", "trace3", "trace4")
GRID = tuple(f"{density}:{sharing}" for density in (0.8, 1.1, 1.4) for sharing in (0.05, 0.25, 0.45))
OURS = "blendserve"
SGLANG_ORDERS = ("lpm", "sglang-fcfs", "sglang-dfs-weight")
POLICIES = (OURS, "dfs", "fcfs", *SGLANG_ORDERS)
GOALS = {"vs_best_sglang": 1.3, "vs_dfs": 1.10, "of_T_o": 0.85, "cached_vs_dfs": 0.9, "idle_share": 0.02}
RSS_POLL_S = 0.5
# Wall seconds per emulated device second: the device runs in real time, the host feeding it as a
# real GPU's would. Each run's lateness (the host delivering a batch after the device would have
# finished the one before) is reported and charged in ``seconds_with_lateness``; past this share
# of the job the comparison says so.
REALTIME_FACTOR = 1.0
LATE_SHARE = 0.02


def cost_model() -> CostModel:
    return CostModel(model_spec(MODEL), HardwareSpec.resolve(HARDWARE))


def write_workload(workload: str, lines: int, path: Path) -> dict:
    """The batch file, and the workload's optimal time ``T_o`` on the emulated device."""
    cost = cost_model()
    requests = paper_requests(workload, lines, cost)
    words = one_token_words(str(prepare(STAND_IN)[0]))
    write_jsonl(path, [request_line(request, words) for request in requests])
    tree = PrefixTree()
    for index, request in enumerate(requests):
        tree.insert(index, request.prompt_ids(), 0.0, 0.0)
    comp = sum(cost.comp_time(request.prompt_len, request.output_len) for request in requests)
    mem = sum(cost.mem_time(request.prompt_len, request.output_len) for request in requests)
    sharing = tree.sharing_ratio()
    return {"lines": lines, "T_comp": comp, "T_mem": mem, "sharing": sharing, "T_o": optimal_time(comp, mem, sharing)}


def run(policy: str, batch_file: Path, work: Path, measure_rss: bool, lock: Path | None = None,
        realtime: float | None = None, extra_args: tuple[str, ...] = ()) -> dict:
    """One `sgl-blend run-batch` as a user runs it; its summary (and its server's peak RSS).
    ``lock``: a file to hold with flock while it runs, so runs on a shared machine take turns;
    ``realtime``: `--emulate-realtime`; ``extra_args``: more run-batch flags."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    summary_path = work / "summary.json"
    command = [*(["flock", str(lock)] if lock else []), sys.executable, "-m", "sgl_blend.cli", "run-batch", "-i", str(batch_file), "-o", str(work / "out.jsonl"),
               "--model", MODEL, "--emulate", DEVICE, "--policy", policy, "--no-progress",
               "--summary-json", str(summary_path),
               *(["--emulate-realtime", str(realtime)] if realtime else []), *extra_args]
    started = time.monotonic()
    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=(work / "stderr.log").open("w"))
    peak = 0
    while job.poll() is None:
        if measure_rss:
            try:
                peak = max(peak, _job_rss(job.pid))
            except psutil.NoSuchProcess:
                pass
        time.sleep(RSS_POLL_S)
    if job.returncode != 0:
        raise RuntimeError(f"{policy} on {batch_file.name} failed ({job.returncode}); see {work / 'stderr.log'}")
    summary = json.loads(summary_path.read_text())
    summary["bench_wall_seconds"] = round(time.monotonic() - started, 1)
    if measure_rss:
        summary["server_peak_rss_gib"] = round(peak / 2**30, 3)
    return summary


def _job_rss(pid: int) -> int:
    """The resident size of the job's HTTP server process, which holds its batch runner."""
    for process in psutil.Process(pid).children(recursive=True):
        if "sgl_blend.launch.http_process" in " ".join(process.cmdline()):
            return process.memory_info().rss
    return 0


def judged(results: dict) -> dict:
    """Per workload: BlendServe's ratios against the goals, measured inside that workload's runs."""
    report = {}
    for workload, entry in results.items():
        runs = entry["runs"]
        if OURS not in runs:
            continue
        ours = runs[OURS]
        row = {"of_T_o": round(entry["T_o"] / ours["seconds"], 3),
               "idle_share": round(ours["idle_seconds"] / ours["seconds"], 4),
               "late": sorted(policy for policy, run in runs.items() if late_share(run) > LATE_SHARE)}
        sglang = [runs[name] for name in SGLANG_ORDERS if name in runs]
        if sglang:
            row["vs_best_sglang"] = round(ours["tokens_per_s"] / max(run["tokens_per_s"] for run in sglang), 3)
        if "dfs" in runs:
            row["vs_dfs"] = round(ours["tokens_per_s"] / runs["dfs"]["tokens_per_s"], 3)
            row["cached_vs_dfs"] = round(ours["cached_tokens"] / max(runs["dfs"]["cached_tokens"], 1), 3)
        row["met"] = {goal: (row[goal] <= target if goal == "idle_share" else row[goal] >= target)
                      for goal, target in GOALS.items() if goal in row}
        report[workload] = row
    return report


def late_share(run: dict) -> float:
    """The share of a run's job time by which its host fell behind the device (0 for a run
    without real-time pacing, whose lateness is not measured)."""
    return (run.get("late_seconds") or 0.0) / run["seconds"]


def markdown(results: dict, report: dict) -> str:
    lines = ["| workload | policy | emulated s | late s | tokens/s | cached tokens | idle share | of T_o |",
             "|---|---|---|---|---|---|---|---|"]
    for workload, entry in results.items():
        for policy, run in entry["runs"].items():
            lines.append(f"| {workload} | {policy} | {run['seconds']:.1f} | {run.get('late_seconds') or 0:.1f} | "
                         f"{run['tokens_per_s']:,.0f} | {run['cached_tokens']:,} | "
                         f"{run['idle_seconds'] / run['seconds']:.2%} | {entry['T_o'] / run['seconds']:.3f} |")
    lines += ["", "| workload | / best SGLang order | / dfs | of T_o | cached / dfs | idle share | host late > 2% |",
              "|---|---|---|---|---|---|---|"]
    for workload, row in report.items():
        cells = [f"{row[goal]}" + ("" if row["met"].get(goal, True) else " (missed)") if goal in row else "-"
                 for goal in ("vs_best_sglang", "vs_dfs", "of_T_o", "cached_vs_dfs", "idle_share")]
        lines.append(f"| {workload} | " + " | ".join(cells) + f" | {', '.join(row['late']) or 'none'} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(results)
    policies = [policy for policy in POLICIES if any(policy in results[w]["runs"] for w in workloads)]
    fig, axis = plt.subplots(figsize=(max(8, 1.2 * len(workloads)), 4))
    width = 0.8 / max(len(policies), 1)
    for index, policy in enumerate(policies):
        values = [_relative(results[w]["runs"], policy) for w in workloads]
        axis.bar([x + index * width for x in range(len(workloads))], values, width, label=policy)
    axis.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))], workloads, rotation=30)
    axis.set_ylabel("tokens/s relative to blendserve")
    axis.axhline(1.0, color="black", linewidth=0.6)
    axis.legend(fontsize=7, ncol=3)
    axis.set_title("run-batch on an emulated H100, Llama-3.1-8B")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _relative(runs: dict, policy: str) -> float:
    """A policy's tokens/s over BlendServe's on the same workload (0 where either did not run)."""
    if policy not in runs or OURS not in runs:
        return 0.0
    return runs[policy]["tokens_per_s"] / runs[OURS]["tokens_per_s"]


def run_grid(args: argparse.Namespace, out: Path, run_one: Callable[[str, Path, Path], dict]) -> None:
    """Each of ``args.workloads`` x ``args.policies`` not yet in ``out`` through ``run_one(policy,
    batch file, work folder)``, the JSON rewritten after every run (a re-run skips what it holds);
    then the report, table and plot beside it. Shared by this bench and `bench.shipped_path_api`."""
    results = json.loads(out.read_text()) if out.exists() else {}
    for workload in args.workloads.split(","):
        batch_file = args.work / f"{workload.replace(':', '_')}-{args.lines}.jsonl"
        batch_file.parent.mkdir(parents=True, exist_ok=True)
        entry = results.setdefault(workload, {"runs": {}})
        if not batch_file.exists() or "T_o" not in entry:
            entry.update(write_workload(workload, args.lines, batch_file))
        for policy in args.policies.split(","):
            if policy in entry["runs"]:
                continue
            entry["runs"][policy] = run_one(policy, batch_file, args.work / "runs" / f"{workload}-{policy}")
            out.write_text(json.dumps(results, indent=2) + "\n")
            print(f"{workload} {policy}: {entry['runs'][policy]['seconds']} s, "
                  f"{entry['runs'][policy]['tokens_per_s']} tok/s", flush=True)
    report = judged(results)
    out.write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".report.json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results, report))
    plot(results, out.with_suffix(".png"))
    print(markdown(results, report))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--workloads", default=",".join(TRACES + GRID))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--rss", action="store_true", help="also record the peak RSS of the job's server process")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--lock", type=Path, default=None, help="flock this file around each run (shared machine)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sgl-blend-shipped-path"))
    parser.add_argument("--realtime", type=float, default=REALTIME_FACTOR,
                        help="run-batch --emulate-realtime (0: forwards return at once, and a host slower than the "
                             "device starves the emulated engine)")
    args = parser.parse_args(argv)
    out = args.out or RESULTS / f"shipped_path_{args.lines}.json"
    realtime = args.realtime or None
    run_grid(args, out, lambda policy, batch_file, work: run(policy, batch_file, work, args.rss, args.lock, realtime))
    return 0


if __name__ == "__main__":
    sys.exit(main())
