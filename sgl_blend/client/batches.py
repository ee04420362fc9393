"""Client side of the Batch API through the official `openai` client: what `sgl-blend batch` and
`sgl-blend demo` do (submit a file, follow a batch with a progress bar, download its results)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
from openai.types import Batch
from tqdm import tqdm

from sgl_blend.client import http

FINISHED = ("completed", "failed", "expired", "cancelled")


def connect(url: str | None = None, api_key: str | None = None) -> openai.OpenAI:
    """A client for an sgl-blend server (``$SGLBLEND_URL`` / ``$SGLBLEND_API_KEY`` by default,
    resolved by `client.http` as for every other request)."""
    url = http.server_url(url)
    return openai.OpenAI(base_url=url if url.endswith("/v1") else url + "/v1", api_key=http.api_key(api_key) or "none")


def first_url(path: Path) -> str:
    """The ``url`` of the file's first request: the batch's endpoint unless told otherwise."""
    with path.open() as handle:
        for text in handle:
            if text.strip():
                try:
                    url = json.loads(text).get("url")
                except (json.JSONDecodeError, AttributeError):
                    url = None
                if isinstance(url, str):
                    return url
                break
    raise ValueError(f"{path}: the first line has no url; pass --endpoint")


def submit(
    client: openai.OpenAI,
    path: Path,
    *,
    endpoint: str | None = None,
    completion_window: str = "24h",
    metadata: dict[str, str] | None = None,
) -> Batch:
    with path.open("rb") as handle:
        uploaded = client.files.create(file=(path.name, handle), purpose="batch")
    # The SDK types both as OpenAI's own values; this server takes any endpoint it serves and any
    # window (``30m``, ``90s``), which the SDK sends as they are.
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint or first_url(path),  # type: ignore[arg-type]
        completion_window=completion_window,  # type: ignore[arg-type]
        metadata=metadata,
    )


def wait(client: openai.OpenAI, batch_id: str, *, progress: bool = True, poll_s: float = 1.0) -> Batch:
    """Poll until the batch finishes, drawing ``request_counts`` as a progress bar."""
    bar = tqdm(unit="req", disable=not progress, dynamic_ncols=True)
    try:
        while True:
            batch = client.batches.retrieve(batch_id)
            counts = batch.request_counts
            if counts is not None:
                bar.total = counts.total
                bar.n = counts.completed + counts.failed
                bar.set_postfix(status=batch.status, failed=counts.failed, refresh=False)
                bar.refresh()
            if batch.status in FINISHED:
                return batch
            time.sleep(poll_s)
    finally:
        bar.close()


def download(client: openai.OpenAI, batch: Batch, directory: Path) -> dict[str, Path]:
    """Write the batch's output and error files (those it has) to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for kind, file_id in (("output", batch.output_file_id), ("errors", batch.error_file_id)):
        if file_id:
            path = directory / f"{batch.id}_{kind}.jsonl"
            client.files.content(file_id).write_to_file(path)
            written[kind] = path
    return written
