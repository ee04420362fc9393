"""Batch files and waiting, for the Batch API tests."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
from openai.types import Batch

from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.ids import new_batch_id, new_file_id
from sgl_blend.server.store import BatchRow, BatchStore, FileRow

FINISHED = ("completed", "failed", "expired", "cancelled")
# A guard against a hung server, not a performance target: every batch here needs seconds.
WAIT_LIMIT_S = 600


def chat_line(custom_id: str, max_tokens: int = 4, text: str | None = None) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny-llama", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                     "messages": [{"role": "user", "content": text or f"Say something about item {custom_id}."}]}}


def chat_lines(count: int, prefix: str = "req", max_tokens: int = 4) -> list[dict[str, Any]]:
    return [chat_line(f"{prefix}-{index}", max_tokens) for index in range(count)]


def mixed_lines(prefix: str, short: int = 10, long: int = 40) -> list[dict[str, Any]]:
    """A few lines that finish at once, then many long ones: the batch is surely mid-run once the
    short ones are done (all lines run together, so equal lines would all finish at the very end)."""
    return chat_lines(short, f"{prefix}-short", max_tokens=2) + chat_lines(long, f"{prefix}-long", max_tokens=128)


def jsonl(lines: list[dict[str, Any] | str]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def upload(client: openai.OpenAI, lines: list[dict[str, Any] | str], name: str = "in.jsonl") -> str:
    return client.files.create(file=(name, jsonl(lines)), purpose="batch").id


def create_batch(client: openai.OpenAI, lines: list[dict[str, Any] | str], *,
                 endpoint: str = "/v1/chat/completions", window: str = "24h", **kwargs: Any) -> Batch:
    return client.batches.create(input_file_id=upload(client, lines), endpoint=endpoint,
                                 completion_window=window, **kwargs)


def wait_until(client: openai.OpenAI, batch_id: str, done: Any = lambda batch: batch.status in FINISHED,
               poll_s: float = 0.2) -> Batch:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(poll_s)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {WAIT_LIMIT_S} s: {batch.request_counts}")


def records(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def add_batch(store: BatchStore, blobs: BlobDir, lines: list[dict[str, Any]]) -> str:
    """A chat batch written straight into a store, as the routes would create it: for tests that
    drive a `BatchRunner` of their own."""
    source = new_file_id()
    blobs.path(source).write_bytes(jsonl(lines))
    store.add_file(FileRow(source, "batch", "in.jsonl", blobs.path(source).stat().st_size, int(time.time())))
    batch = BatchRow(new_batch_id(), "/v1/chat/completions", source, "24h", "validating", int(time.time()),
                     int(time.time()) + 3600, output_blob=new_file_id(), error_blob=new_file_id())
    store.add_batch(batch)
    return batch.id
