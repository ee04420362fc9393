"""The batches a runner coordinates, and where each one is in its life.

A batch the runner holds is validated (its lines parsed, prepared and, when needed, tokenised),
then assigned (its lines spread over the worker slots), then planned (ranked in the global plan,
when the runner plans), then dispatched, and finally closed (finished, cancelled or expired).
`ActiveBatch` holds one batch's state through that life and `ActiveBatches` all of them; the
planner, the dispatcher and the runner ask them, never each other's insides.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.server.prepared import PreparedBatch
from sgl_blend.server.store import BatchRow, LineRow

if TYPE_CHECKING:
    from sgl_blend.server.assignment import Slot


@dataclass
class Feed:
    """A batch's unfinished lines for one slot, fetched from the store a chunk at a time."""

    after_line: int = 0
    after_rank: int = -2  # plan ranks start at -1 (lines that fail without running)
    buffer: deque[LineRow] = field(default_factory=deque)
    retry: deque[LineRow] = field(default_factory=deque)
    exhausted: bool = False

    def next(self) -> LineRow | None:
        if self.retry:
            return self.retry.popleft()
        return self.buffer.popleft() if self.buffer else None

    def peek(self) -> LineRow | None:
        if self.retry:
            return self.retry[0]
        return self.buffer[0] if self.buffer else None

    @property
    def empty(self) -> bool:
        return self.exhausted and not self.buffer and not self.retry


@dataclass
class ActiveBatch:
    row: BatchRow
    prepared: PreparedBatch
    # one per slot the batch's lines are assigned to; empty until the batch is assigned
    feeds: dict[Slot, Feed] = field(default_factory=dict)
    inflight: dict[int, asyncio.Task] = field(default_factory=dict)
    # line number -> (worker, SGLang request id) of each line being sent
    requests: dict[int, tuple[str, str]] = field(default_factory=dict)
    task: asyncio.Task | None = None
    closing: bool = False
    planned: bool = False
    _prompts: dict[int, WorkItem] | None = None

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def assigned(self) -> bool:
        return bool(self.feeds)

    @property
    def settling(self) -> bool:
        """Still being validated or spread over the slots: a plan made now would miss it."""
        return self.row.status == "validating" or (self.row.status == "in_progress" and not self.assigned)

    @property
    def plannable(self) -> bool:
        return self.row.status == "in_progress" and self.assigned and not self.closing

    @property
    def dispatching(self) -> bool:
        return self.plannable and self.planned

    async def prompts(self) -> dict[int, WorkItem]:
        """Every tokenised line's prompt, read from the prepared folder once (off the event loop)."""
        if self._prompts is None:
            self._prompts = await asyncio.to_thread(self.prepared.prompts)
        return self._prompts

    def reread(self) -> None:
        """Forget what the feeds buffered and read each slot's unfinished lines from the store again
        (lines in flight are skipped as they are read)."""
        self.feeds = {slot: Feed() for slot in self.feeds}


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

    def settling(self) -> bool:
        return any(batch.settling for batch in self._by_id.values())

    def plannable(self) -> list[ActiveBatch]:
        return [batch for batch in self._by_id.values() if batch.plannable]

    def dispatching(self) -> list[ActiveBatch]:
        return [batch for batch in self._by_id.values() if batch.dispatching]

    def tasks(self) -> list[asyncio.Task]:
        """Every task of every batch: lines in flight and lifecycle steps."""
        return [task for batch in self._by_id.values() for task in (*batch.inflight.values(), batch.task) if task]
