"""The demo batch of README command 1: ShareGPT prompts plus few-shot prompts with shared
prefixes, sent as offline work to the running server and ordered by its BlendServe scheduler."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bench.batch_files import fewshot_lines, sharegpt_lines, write_jsonl
from sgl_blend.run_batch import run_job


def demo_lines(n: int) -> list[dict]:
    """Half ShareGPT chat prompts, half few-shot prompts sharing long prefixes, all chat lines."""
    shared = fewshot_lines(n=n - n // 2, groups=4, chat=True)
    chats = sharegpt_lines(n=n // 2, max_prompt_chars=1200, max_tokens_cap=64)
    for line in shared:
        line["body"]["max_tokens"] = min(line["body"]["max_tokens"], 32)
    return chats + shared


def run_demo_batch(base_url: str, api_key: str | None, work_dir: Path, n: int) -> dict:
    batch_file = write_jsonl(work_dir / "demo-batch.jsonl", demo_lines(n))
    output, errors = work_dir / "demo-batch-output.jsonl", work_dir / "demo-batch-errors.jsonl"
    for stale in (output, errors):
        stale.unlink(missing_ok=True)
    print(f"[demo] offline batch: {n} lines from {batch_file}", flush=True)
    totals = asyncio.run(run_job(batch_file, output, errors, base_url, api_key=api_key, job_id="demo"))
    summary = {"lines": n, **totals.summary(), "output": str(output)}
    print("[demo] summary: " + json.dumps(summary), flush=True)
    return summary
