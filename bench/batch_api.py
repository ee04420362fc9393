"""Batch API benchmark: the same evaluation batch, split into two batches submitted together
through ``/v1/files`` + ``/v1/batches`` (the official `openai` client), once per offline policy,
each on a freshly started server with the same KV pool, chunk, engine flags and in-flight window.

With ``blendserve`` and ``dfs`` the server's runner plans both batches' lines together and feeds
them in plan order; ``fcfs`` is the plugin's arrival order; ``lpm``, ``sglang-fcfs`` and
``sglang-dfs-weight`` are SGLang's own orderings over the runner's window (`core.policy_registry`).
Cached tokens are SGLang's own, summed from the batches' ``usage``; time is from the first
``create`` to the last batch's ``completed``. Writes ``bench/results/batch_api.json`` and a plot.

    python -m bench.batch_api --model tiny-llama --n 400 --window 32
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai

from sgl_blend.workloads.batch_files import evaluation_lines
from bench.real_engine import ratios, workload_parser, write_report
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.jobs.fresh_server import policy_launch
from sgl_blend.launch.flags import with_defaults
from sgl_blend.launch.supervisor import start_server

RESULTS = Path(__file__).parent / "results"
API_KEY = "sk-bench"


def run_policy(model: str, policy: str, halves: list[bytes], work: Path, kv_tokens: int, port: int,
               window: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    settings = policy_launch(policy)
    config = BatchApiConfig(data_dir=work / "data", max_inflight=window)
    args = with_defaults(["--port", str(port), "--api-key", API_KEY, "--enable-cache-report",
                          "--max-total-tokens", str(kv_tokens)], settings.sglang_flags())
    server = start_server(model, args, log_path=work / "server.log", settings=settings, batch_api=config)
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
        files = [client.files.create(file=(f"half{index}.jsonl", data), purpose="batch").id
                 for index, data in enumerate(halves)]
        start = time.monotonic()
        batches = [client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                         completion_window="24h").id for file_id in files]
        while True:
            current = [client.batches.retrieve(batch_id) for batch_id in batches]
            if all(batch.status in ("completed", "failed", "expired", "cancelled") for batch in current):
                break
            time.sleep(0.5)
        seconds = time.monotonic() - start
    finally:
        server.stop()
    usage = [batch.usage for batch in current]
    prompt = sum(u.input_tokens for u in usage)
    cached = sum(u.input_tokens_details.cached_tokens for u in usage)
    output = sum(u.output_tokens for u in usage)
    return {"policy": policy, "window": window, "status": [batch.status for batch in current],
            "completed": sum(batch.request_counts.completed for batch in current),
            "failed": sum(batch.request_counts.failed for batch in current),
            "prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": output,
            "cache_hit_ratio": round(cached / prompt, 4) if prompt else 0.0, "seconds": round(seconds, 2),
            "tokens_per_s": round((prompt + output) / seconds, 1)}


def main() -> None:
    args = workload_parser(__doc__.splitlines()[0], 31800, RESULTS / "batch_api.json").parse_args()
    work = args.out.parent / f"{args.out.stem}-work"
    lines = evaluation_lines(args.n, families=args.families)
    halves = ["".join(json.dumps(line) + "\n" for line in lines[part::2]).encode() for part in (0, 1)]
    results = [run_policy(args.model, policy, halves, work / policy, args.kv_tokens, args.port, args.window)
               for policy in args.policies.split(",")]
    report = {"command": f"python -m bench.batch_api --model {args.model} --n {args.n} --window {args.window} "
                         f"--kv-tokens {args.kv_tokens}",
              "workload": f"evaluation: {args.families} few-shot families + 25% unique ShareGPT, shuffled, "
                          "split into two batches submitted together",
              "n": args.n, "kv_tokens": args.kv_tokens, "window": args.window,
              "ratios": ratios(results, args.window), "results": results}
    write_report(args.out, report, f"Batch API, {args.model}, two batches x{args.n // 2}")


if __name__ == "__main__":
    main()
