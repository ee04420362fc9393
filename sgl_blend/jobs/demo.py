"""The demo batch of README command 1: ShareGPT prompts plus few-shot prompts with shared
prefixes, submitted through the server's OpenAI Files and Batches API with the official `openai`
client, and run as offline work ordered by the server's BlendServe scheduler."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import openai

from sgl_blend.batch_lines.outcome import LineUsage
from sgl_blend.client.batches import download, submit, wait
from sgl_blend.workloads.batch_files import fewshot_lines, sharegpt_lines, write_jsonl


def demo_lines(n: int) -> list[dict]:
    """Half ShareGPT chat prompts, half few-shot prompts sharing long prefixes, all chat lines."""
    shared = fewshot_lines(n=n - n // 2, groups=4, chat=True)
    chats = sharegpt_lines(n=n // 2, max_prompt_chars=1200, max_tokens_cap=64)
    for line in shared:
        line["body"]["max_tokens"] = min(line["body"]["max_tokens"], 32)
    return chats + shared


def run_demo_batch(client: openai.OpenAI, work_dir: Path, lines: Sequence[dict]) -> dict:
    """Submit ``lines`` (`demo_lines`, made where the ShareGPT package is installed: the GPU check
    carries them to a machine without it) as one batch, wait for it, and summarise it."""
    n = len(lines)
    batch_file = write_jsonl(work_dir / "demo-batch.jsonl", lines)
    print(f"[demo] offline batch: {n} lines from {batch_file}, through POST /v1/files and /v1/batches", flush=True)
    start = time.monotonic()
    batch = submit(client, batch_file, metadata={"source": "sgl-blend demo"})
    print(f"[demo] batch {batch.id} is {batch.status}", flush=True)
    batch = wait(client, batch.id, poll_s=0.5)
    seconds = time.monotonic() - start
    files = download(client, batch, work_dir)
    counts, usage = batch.request_counts, batch.usage
    tokens = (
        LineUsage(usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens)
        if usage
        else LineUsage()
    )
    summary = {
        "batch": batch.id,
        "status": batch.status,
        "lines": counts.total if counts else n,
        "completed": counts.completed if counts else 0,
        "failed": counts.failed if counts else 0,
        **tokens.report(seconds),
        "output": str(files.get("output")),
        **({"errors": str(files["errors"])} if "errors" in files else {}),
    }
    print("[demo] summary: " + json.dumps(summary), flush=True)
    return summary
