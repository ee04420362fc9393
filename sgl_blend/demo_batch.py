"""The demo batch of README command 1, submitted exactly as a user would: the official `openai`
client against the server's `/v1/files` and `/v1/batches` routes."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import openai
from tqdm import tqdm

from bench.batch_files import fewshot_lines, sharegpt_lines

POLL_S = 1.0


def demo_lines(n: int) -> list[dict]:
    """Half ShareGPT chat prompts, half few-shot prompts sharing long prefixes."""
    shared = fewshot_lines(n=n - n // 2, groups=4, chat=True)
    chats = sharegpt_lines(n=n // 2, max_tokens_cap=64)
    for line in shared:
        line["body"]["max_tokens"] = min(line["body"]["max_tokens"], 64)
    return chats + shared


def run_demo_batch(client: openai.OpenAI, work_dir: Path, n: int) -> dict:
    payload = "".join(json.dumps(line) + "\n" for line in demo_lines(n)).encode()
    uploaded = client.files.create(file=("demo-batch.jsonl", io.BytesIO(payload)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    print(f"[demo] batch {batch.id}: {n} lines submitted", flush=True)
    start = time.monotonic()
    with tqdm(total=n, unit="line", desc="[demo] batch") as bar:
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(POLL_S)
            batch = client.batches.retrieve(batch.id)
            counts = batch.request_counts
            if counts is not None:
                bar.update(counts.completed + counts.failed - bar.n)
    seconds = time.monotonic() - start
    output_path = work_dir / "demo-batch-output.jsonl"
    prompt = completion = cached = 0
    if batch.output_file_id:
        output_path.write_bytes(client.files.content(batch.output_file_id).content)
        for text in output_path.read_text().splitlines():
            usage = json.loads(text)["response"]["body"].get("usage") or {}
            prompt += usage.get("prompt_tokens", 0)
            completion += usage.get("completion_tokens", 0)
            cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    summary = {
        "batch": batch.id,
        "status": batch.status,
        "lines": n,
        "completed": batch.request_counts.completed if batch.request_counts else 0,
        "failed": batch.request_counts.failed if batch.request_counts else 0,
        "seconds": round(seconds, 1),
        "tokens_per_s": round((prompt + completion) / seconds, 1) if seconds else 0.0,
        "cache_hit_ratio": round(cached / prompt, 3) if prompt else 0.0,
        "output": str(output_path),
    }
    print("[demo] summary: " + json.dumps(summary), flush=True)
    return summary
