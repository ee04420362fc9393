"""What every fault test checks of a batch once it ended: the output and error custom_ids together
are the input's, none twice; every result line parses; the counts and committed byte lengths in the
store match the files on disk."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.store import BatchStore


def violations(store: BatchStore, blobs: BlobDir, batch_id: str, custom_ids: list[str],
               status: str = "completed") -> list[str]:
    """Every broken promise of the batch's results, as sentences; empty when it kept them all."""
    row = store.get_batch(batch_id)
    found: list[str] = []
    if row.status != status:
        found.append(f"{batch_id} is {row.status}, not {status}")
    results: list[dict[str, Any]] = []
    for kind, file_id, committed, count in (("output", row.output_file_id, row.output_bytes, row.completed),
                                            ("error", row.error_file_id, row.error_bytes, row.failed)):
        published = store.get_file(file_id) if file_id else None
        size = blobs.path(file_id).stat().st_size if file_id else 0
        if (published.bytes if published else 0) != committed or size != committed:
            found.append(f"{batch_id} {kind}: file {size} bytes, published {published and published.bytes},"
                         f" committed {committed}")
        lines = _lines(blobs.path(file_id)) if file_id else []
        if len(lines) != count:
            found.append(f"{batch_id} {kind}: {len(lines)} records, the store counts {count}")
        for number, line in enumerate(lines, 1):
            try:
                results.append(json.loads(line))
            except ValueError:
                found.append(f"{batch_id} {kind} line {number} does not parse: {line[:80]!r}")
    ids = Counter(record.get("custom_id") for record in results)
    doubled = sorted(custom_id for custom_id, times in ids.items() if times > 1)
    if doubled:
        found.append(f"{batch_id}: written more than once: {doubled}")
    if set(ids) != set(custom_ids):
        found.append(f"{batch_id}: lost {sorted(set(custom_ids) - set(ids))}, unknown {sorted(set(ids) - set(custom_ids))}")
    if row.total != len(custom_ids):
        found.append(f"{batch_id}: total {row.total}, input has {len(custom_ids)}")
    return found


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        return data.split(b"\n")  # a torn last record: it will not parse
    return data.splitlines()
