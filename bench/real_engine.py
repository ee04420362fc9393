"""Real-engine benchmark: one batch job per offline policy through a real SGLang server.

Every policy runs the same batch file on a freshly started server with the same KV pool, so
throughput and SGLang's own ``cached_tokens`` are compared inside one run of this command.
Writes ``bench/results/real_engine.json`` and a bar chart beside it.

    python -m bench.real_engine --model smollm2-135m --workload fewshot --n 300
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.batch_files import fewshot_lines, sharegpt_lines, write_jsonl
from sgl_blend.run_batch import POLICIES, run_on_fresh_server

RESULTS = Path(__file__).parent / "results"


def run_policy(model: str, policy: str, batch_file: Path, work: Path, kv_tokens: int, port: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    for stale in ("out.jsonl", "errors.jsonl"):
        (work / stale).unlink(missing_ok=True)
    totals, _state = run_on_fresh_server(
        model, policy, batch_file, work / "out.jsonl", work / "errors.jsonl",
        sglang_args=["--port", str(port), "--max-total-tokens", str(kv_tokens)], server_log=work / "server.log")
    return {"policy": policy, **totals.summary()}


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [result["policy"] for result in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.bar(names, [result["tokens_per_s"] for result in results], color="tab:blue")
    left.set_ylabel("tokens/s (prompt + output)")
    right.bar(names, [result["cache_hit_ratio"] for result in results], color="tab:green")
    right.set_ylabel("cached prompt tokens / prompt tokens")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--workload", choices=("fewshot", "sharegpt"), default="fewshot")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--kv-tokens", type=int, default=8192)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--port", type=int, default=31700)
    parser.add_argument("--out", type=Path, default=RESULTS / "real_engine.json")
    args = parser.parse_args()
    work = args.out.parent / f"{args.out.stem}-work"
    lines = fewshot_lines(n=args.n) if args.workload == "fewshot" else sharegpt_lines(n=args.n)
    batch_file = write_jsonl(work / f"{args.workload}.jsonl", lines)
    results = [run_policy(args.model, policy, batch_file, work / policy, args.kv_tokens, args.port)
               for policy in args.policies.split(",")]
    report = {"model": args.model, "workload": args.workload, "n": args.n, "kv_tokens": args.kv_tokens, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(results, args.out.with_suffix(".png"), f"{args.model}, {args.workload} x{args.n}, KV {args.kv_tokens} tokens")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
