"""The pass criterion every fault test shares: a batch's output and error files together hold each
input custom_id exactly once, every line of both parses, and the counts match the files."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import openai


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[bytes]:
    """The raw lines of a file (none for a batch without that file)."""
    return client.files.content(file_id).content.splitlines() if file_id else []


def violations(client: openai.OpenAI, batch_id: str, lines: list[dict[str, Any]]) -> list[str]:
    """Everything wrong with a finished batch's files against its input ``lines``; empty when none."""
    batch = client.batches.retrieve(batch_id)
    found: list[str] = []
    seen: Counter[str] = Counter()
    for kind, file_id in (("output", batch.output_file_id), ("error", batch.error_file_id)):
        raw = file_lines(client, file_id)
        if file_id is not None and client.files.retrieve(file_id).bytes != sum(len(line) + 1 for line in raw):
            found.append(f"the {kind} file's byte count does not match its content")
        for number, line in enumerate(raw, start=1):
            try:
                seen[json.loads(line)["custom_id"]] += 1
            except (ValueError, KeyError) as error:
                found.append(f"{kind} line {number} does not parse: {error}")
    expected = Counter(line["custom_id"] for line in lines)
    found += [f"{custom_id} appears {count} times" for custom_id, count in seen.items() if count > 1]
    if set(seen) != set(expected):
        found.append(f"missing {sorted(set(expected) - set(seen))[:5]}, extra {sorted(set(seen) - set(expected))[:5]}")
    counts = batch.request_counts
    if (counts.completed, counts.failed) != (len(file_lines(client, batch.output_file_id)),
                                             len(file_lines(client, batch.error_file_id))):
        found.append(f"request_counts {counts} do not match the files")
    return found
