"""Batch files and waiting, for the Batch API tests."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable

import openai
from openai.types import Batch

from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.ids import new_batch_id, new_file_id
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import BatchRow, BatchStore, FileRow
from tests.waiting import WAIT_LIMIT_S, wait_for, wait_for_async

FINISHED = ("completed", "failed", "expired", "cancelled")
__all__ = ["WAIT_LIMIT_S"]


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
    """The batch, as the API shows it, once ``done(batch)`` holds (by default: once it finished)."""
    def batch_if_done() -> Batch | None:
        batch = client.batches.retrieve(batch_id)
        return batch if done(batch) else None

    return wait_for(batch_if_done, f"batch {batch_id} to reach the awaited state", poll_s=poll_s)


def run_until(runner: BatchRunner, condition: Callable[[], Any], what: str) -> None:
    """Run a `BatchRunner` of the test's own until ``condition()`` holds, then stop it as a server
    shutting down would (its finished lines committed, its leases released)."""
    async def run() -> None:
        task = asyncio.create_task(runner.run())
        try:
            await wait_for_async(condition, what)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())


def records(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def add_batch(store: BatchStore, blobs: BlobDir, lines: list[dict[str, Any]], *, owner: str | None = None) -> str:
    """A chat batch written straight into a store, as the routes would create it: for tests that
    drive a `BatchRunner` of their own. With ``owner``, that runner holds its lease from the start
    (no server's runner sharing the store takes it up)."""
    source = new_file_id()
    blobs.path(source).write_bytes(jsonl(lines))
    now = int(time.time())
    store.add_file(FileRow(source, "batch", "in.jsonl", blobs.path(source).stat().st_size, now))
    batch = BatchRow(new_batch_id(), "/v1/chat/completions", source, "24h", "validating", now, now + 3600,
                     output_blob=new_file_id(), error_blob=new_file_id(), owner=owner,
                     lease_until=now + WAIT_LIMIT_S if owner else 0.0)
    store.add_batch(batch)
    return batch.id
