"""The batches a runner coordinates, and where each one is in its life.

A batch the runner holds is validated (its lines parsed, prepared and, when needed, tokenised,
a chunk at a time), and each chunk's lines are handed to the feed at once, so they run while the
rest is still being read; it is finished once every line has its result, and closed early when it
is cancelled or expires. `ActiveBatch` holds one batch's state through that life and
`ActiveBatches` all of them; the feed, the dispatcher and the runner ask them, never each other's
insides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

from sgl_blend.server.prepared import PreparedBatch
from sgl_blend.server.store import BatchRow, LineRow


@dataclass
class ActiveBatch:
    """``lines``: the batch's runnable lines handed to the feed that have no result yet, by line
    number; ``inflight``: the tasks sending some of them; ``requests``: (worker, SGLang request id)
    of each line being sent; ``task``: the lifecycle step under way; ``validation``: the reading of
    its input, which runs beside the steps (a batch being read may be cancelled); ``taken_up``: its
    lines are in the feed (it is being validated, or was validated before)."""

    row: BatchRow
    prepared: PreparedBatch
    lines: dict[int, LineRow] = field(default_factory=dict)
    inflight: dict[int, asyncio.Task] = field(default_factory=dict)
    requests: dict[int, tuple[str, str]] = field(default_factory=dict)
    task: asyncio.Task | None = None
    validation: asyncio.Task | None = None
    closing: bool = False
    taken_up: bool = False

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def validating(self) -> bool:
        return self.row.status == "validating"

    @property
    def dispatching(self) -> bool:
        return self.taken_up and not self.closing and self.row.status in ("validating", "in_progress")

    def result_in(self, line_number: int) -> None:
        self.lines.pop(line_number, None)


class ActiveBatches:
    """Every batch the runner holds, by id, in the order it took them up."""

    def __init__(self) -> None:
        self._by_id: dict[str, ActiveBatch] = {}

    def __iter__(self) -> Iterator[ActiveBatch]:
        return iter(list(self._by_id.values()))

    def __contains__(self, batch_id: str) -> bool:
        return batch_id in self._by_id

    def get(self, batch_id: str) -> ActiveBatch | None:
        return self._by_id.get(batch_id)

    def ids(self) -> list[str]:
        return list(self._by_id)

    def add(self, batch: ActiveBatch) -> None:
        self._by_id[batch.id] = batch

    def pop(self, batch_id: str) -> ActiveBatch:
        return self._by_id.pop(batch_id)

    def validating(self) -> bool:
        """Whether any batch is still being validated (its lines are not all known yet)."""
        return any(batch.validating and not batch.closing for batch in self._by_id.values())

    def tasks(self) -> list[asyncio.Task]:
        """Every task of every batch: lines in flight and lifecycle steps."""
        return [
            task
            for batch in self._by_id.values()
            for task in (*batch.inflight.values(), batch.task, batch.validation)
            if task
        ]
