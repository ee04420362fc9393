"""Workloads as JSONL: one request a line, lengths and prefix-block hashes, no token arrays.

A first line ``{"workload": {...}}`` records how the file was generated (generator, n, seed,
targets), so a file can always be regenerated rather than trusted. Loading interns prefix
chains: 400K requests that share a handful of system prompts hold a handful of tuples.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sgl_blend.sim.workload import SimRequest


def save_jsonl(requests: Iterable[SimRequest], path: Path, meta: dict[str, Any] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        handle.write(json.dumps({"workload": meta or {}}) + "\n")
        for r in requests:
            handle.write(
                json.dumps(
                    {
                        "rid": r.rid,
                        "source": r.source,
                        "prefix": [list(s) for s in r.prefix],
                        "unique_len": r.unique_len,
                        "output_len": r.output_len,
                        "max_new_tokens": r.max_new_tokens,
                        "exact": r.exact,
                    }
                )
                + "\n"
            )
    return path


def is_workload_file(path: Path) -> bool:
    """Whether ``path`` is a workload JSONL (`save_jsonl`'s header, or its request rows) rather
    than an OpenAI batch file, told by its first non-blank line."""
    with path.open() as handle:
        for line in handle:
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(row, dict) and ("workload" in row or "prefix" in row)
    return False


def load_jsonl(path: Path) -> tuple[list[SimRequest], dict[str, Any]]:
    """The requests and the generation record."""
    chains: dict[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]] = {}
    requests: list[SimRequest] = []
    meta: dict[str, Any] = {}
    with path.open() as handle:
        for line in handle:
            if not line.strip():
                continue
            row = json.loads(line)
            if "workload" in row:
                meta = row["workload"]
                continue
            prefix = tuple((key, int(length)) for key, length in row["prefix"])
            prefix = chains.setdefault(prefix, prefix)
            requests.append(
                SimRequest(
                    row["rid"],
                    row.get("source", ""),
                    prefix,
                    int(row["unique_len"]),
                    int(row["output_len"]),
                    int(row["max_new_tokens"]),
                    bool(row["exact"]),
                )
            )
    return requests, meta
