"""Real-engine benchmark: one batch job per offline policy through a real SGLang server.

An evaluation-style batch (shared-prefix few-shot families with short and long outputs, plus
unique ShareGPT prompts, shuffled) runs once per policy on a freshly started server with the same
KV pool, chunk and engine flags, so throughput and SGLang's own ``cached_tokens`` are compared as
ratios inside one run of this command. ``dfs`` is the exact global DFS order (the whole batch
planned, fed in order); ``fcfs`` is the plugin's arrival order; ``lpm``, ``sglang-fcfs`` and
``sglang-dfs-weight`` are SGLang's own orderings over the same window (`core.policy_registry`).
The blendserve run is repeated at each ``--window-check`` in-flight window to show the plan, not
the window, decides what the scheduler admits. Writes ``bench/results/real_engine.json`` and a
bar chart beside it.

    python -m bench.real_engine --model tiny-llama --n 400 --window 32 --window-check 64,1024
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from sgl_blend.workloads.batch_files import evaluation_lines, write_jsonl
from sgl_blend.jobs.fresh_server import run_on_fresh_server
from sgl_blend.jobs.run_batch import JobOptions, job_store_dir

RESULTS = Path(__file__).parent / "results"


def run_policy(model: str, policy: str, batch_file: Path, work: Path, kv_tokens: int, port: int,
               window: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    for stale in ("out.jsonl", "errors.jsonl"):
        (work / stale).unlink(missing_ok=True)
    shutil.rmtree(job_store_dir(work / "out.jsonl"), ignore_errors=True)
    totals, state = run_on_fresh_server(
        model, policy, batch_file, work / "out.jsonl", work / "errors.jsonl",
        options=JobOptions(max_inflight=window, show_progress=False),
        sglang_args=["--port", str(port), "--max-total-tokens", str(kv_tokens)], server_log=work / "server.log")
    offline = (state or {}).get("offline") or {}
    return {"policy": policy, "window": window, **totals.summary(), "scheduler_counts": offline.get("counts", {})}


def ratios(results: list[dict], window: int) -> dict:
    """The figures the benchmark is judged on, as ratios inside this run."""
    main = {result["policy"]: result for result in results if result["window"] == window}
    out = {}
    ours = main.get("blendserve")
    if ours:
        for other in ("dfs", "fcfs", "lpm", "sglang-fcfs", "sglang-dfs-weight"):
            if other in main:
                out[f"cached_vs_{other}"] = round(ours["cached_tokens"] / max(main[other]["cached_tokens"], 1), 4)
                out[f"tokens_per_s_vs_{other}"] = round(ours["tokens_per_s"] / max(main[other]["tokens_per_s"], 1e-9), 4)
    windows = {result["window"]: result for result in results if result["policy"] == "blendserve"}
    if len(windows) > 1:
        cached = [result["cached_tokens"] for result in windows.values()]
        out["blendserve_cached_change_across_windows"] = round((max(cached) - min(cached)) / max(max(cached), 1), 4)
    return out


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{result['policy']}\nw={result['window']}" for result in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    left.bar(names, [result["tokens_per_s"] for result in results], color="tab:blue")
    left.set_ylabel("tokens/s (prompt + output)")
    right.bar(names, [result["cache_hit_ratio"] for result in results], color="tab:green")
    right.set_ylabel("cached prompt tokens / prompt tokens")
    for axis in (left, right):
        axis.tick_params(axis="x", labelsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_report(out: Path, report: dict, title: str) -> None:
    """The JSON beside its bar chart, and the JSON on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report["results"], out.with_suffix(".png"), title)
    print(json.dumps(report, indent=2))


def workload_parser(description: str, port: int, out: Path) -> argparse.ArgumentParser:
    """The flags every real-engine benchmark shares: model, batch size and shape, window, KV pool."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--n", type=int, default=400, help="lines (at least 10x the window)")
    parser.add_argument("--families", type=int, default=32)
    parser.add_argument("--window", type=int, default=32, help="in-flight lines for every policy")
    parser.add_argument("--kv-tokens", type=int, default=8192)
    parser.add_argument("--policies", default="blendserve,dfs,fcfs,lpm,sglang-fcfs,sglang-dfs-weight")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--out", type=Path, default=out)
    return parser


def main() -> None:
    parser = workload_parser(__doc__.splitlines()[0], 31700, RESULTS / "real_engine.json")
    parser.add_argument("--window-check", default="64,1024", help="extra blendserve windows")
    args = parser.parse_args()
    work = args.out.parent / f"{args.out.stem}-work"
    batch_file = write_jsonl(work / "evaluation.jsonl", evaluation_lines(args.n, families=args.families))
    runs = [(policy, args.window) for policy in args.policies.split(",")]
    runs += [("blendserve", int(window)) for window in args.window_check.split(",") if window and int(window) != args.window]
    results = [run_policy(args.model, policy, batch_file, work / f"{policy}-w{window}", args.kv_tokens, args.port, window)
               for policy, window in runs]
    report = {"command": "python -m bench.real_engine " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
              "model": args.model, "workload": f"evaluation: {args.families} few-shot families + 25% unique ShareGPT, shuffled",
              "n": args.n, "kv_tokens": args.kv_tokens, "window": args.window, "ratios": ratios(results, args.window),
              "results": results}
    write_report(args.out, report, f"{args.model}, evaluation batch x{args.n}, KV {args.kv_tokens} tokens")


if __name__ == "__main__":
    main()
