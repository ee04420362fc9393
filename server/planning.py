"""One global plan over the unfinished lines of every batch the runner holds (BlendServe §4).

When a batch is taken up, or another joins, every unfinished line of every running batch is
tokenised with the served model's tokenizer and planned together; each line's rank in the plan's
feed order and its placement are written to the store, so a restarted runner feeds by the same
plan without planning again. Output-length samples are ranked first; once all are back, the rest
is planned again with their lengths. Planning runs in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Hashable

from sgl_blend.jobs.lines import BatchLine
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.jobs.sender import LineOutcome
from sgl_blend.server.assignment import parse_rows
from sgl_blend.server.store import LineRow

if TYPE_CHECKING:
    from sgl_blend.jobs.line_plan import LinePlanner
    from sgl_blend.server.dispatch import ActiveBatch
    from sgl_blend.server.runner import BatchRunner

logger = logging.getLogger(__name__)
FAILS_AT_ONCE_RANK = -1  # lines that fail without running go first: they cost nothing


class GlobalPlanState:
    def __init__(self, planner: LinePlanner) -> None:
        self.planner = planner
        self.task: asyncio.Task | None = None
        self.plans = 0
        self.samples: dict[Hashable, WorkItem] = {}
        self.observed: dict[Hashable, tuple[WorkItem, int]] = {}
        self.samples_back: set[Hashable] = set()

    def maybe_start(self, runner: BatchRunner) -> None:
        """Plan (in the background) when a running batch is not in the plan yet, or when every
        output-length sample is back; batches still being validated or assigned are waited for,
        so batches submitted together are planned together."""
        if self.task is not None:
            if not self.task.done():
                return
            if not self.task.cancelled() and self.task.exception() is not None:
                logger.error("planning the batches failed; trying again", exc_info=self.task.exception())
            self.task = None
        active = list(runner._active.values())
        if any(batch.row.status == "validating" or (batch.row.status == "in_progress" and not batch.feeds)
               for batch in active):
            return
        batches = [batch for batch in active if batch.row.status == "in_progress" and not batch.closing]
        if batches and (self._samples_done() or any(not batch.planned for batch in batches)):
            self.task = asyncio.create_task(self._plan(runner, batches))
            self.task.add_done_callback(lambda _task: runner.wake(refresh=False))

    def _samples_done(self) -> bool:
        return bool(self.samples) and self.samples_back >= self.samples.keys()

    def line_done(self, key: Hashable, outcome: LineOutcome) -> None:
        if key in self.samples:
            self.samples_back.add(key)
            if outcome.ok:
                self.observed[key] = (self.samples[key], outcome.usage.completion_tokens)

    async def _plan(self, runner: BatchRunner, batches: list[ActiveBatch]) -> None:
        store = runner.store
        if not self.plans and not self.samples:
            unplanned = await asyncio.gather(*(asyncio.to_thread(store.unplanned_lines, batch.id) for batch in batches))
            if not any(unplanned):  # a restart: the store already holds the plan
                self._adopt(runner, batches)
                return
        lines: dict[Hashable, BatchLine] = {}
        fails: dict[str, list[int]] = defaultdict(list)
        for batch in batches:
            input_file = batch.row.input_file_id

            def read_line(row: LineRow) -> bytes:
                return runner.blobs.read_range(input_file, row.byte_offset, row.byte_length)

            rows = await asyncio.to_thread(store.pending_lines, batch.id)
            runnable, invalid = await asyncio.to_thread(parse_rows, rows, read_line, (batch.row.endpoint,))
            lines.update(((batch.id, row.line_number), line) for row, line in runnable)
            fails[batch.id] = [row.line_number for row in invalid]
        items = await asyncio.to_thread(self.planner.work_items, lines)
        samples_done = self._samples_done()
        plan = await asyncio.to_thread(self.planner.plan, list(items.values()), self.observed if samples_done else None)
        places: dict[str, list[tuple[int, int, str | None]]] = defaultdict(list)
        for batch_id, numbers in fails.items():
            places[batch_id] += [(number, FAILS_AT_ONCE_RANK, None) for number in numbers]
        for rank, key in enumerate(plan.feed):
            batch_id, number = key
            places[batch_id].append((number, rank, plan.placements[key].encode()))
        for batch in batches:
            await asyncio.to_thread(store.set_plan, batch.id, runner.owner, places.get(batch.id, []))
        self.samples = {key: items[key] for key in plan.samples}
        self.samples_back = set()
        if samples_done:
            self.observed = {}
        self.plans += 1
        logger.info("planned %d lines of %d batches (%d samples first, memory share %.2f)", len(plan.feed),
                    len(batches), len(plan.samples), plan.memory_share)
        self._adopt(runner, batches)

    @staticmethod
    def _adopt(runner: BatchRunner, batches: list[ActiveBatch]) -> None:
        for batch in batches:
            batch.planned = True
            batch.reread()
