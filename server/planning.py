"""One global plan over the unfinished lines of every batch the runner holds (BlendServe §4).

When a batch is taken up, or another joins, every unfinished line of every running batch is
planned together, from the prompts validation tokenised; each line's rank in the plan's feed order
and its placement are written to the store, so a restarted runner feeds by the same plan without
planning again. Output-length samples are ranked first; once all are back, the rest is planned
again with their lengths. Planning runs in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import defaultdict
from typing import Callable, Hashable

from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.placement import Placement
from sgl_blend.batch_lines.plan import LinePlanner
from sgl_blend.batch_lines.sender import LineOutcome
from sgl_blend.server.active import ActiveBatch, ActiveBatches
from sgl_blend.server.store import BatchStore

logger = logging.getLogger(__name__)
FAILS_AT_ONCE_RANK = -1  # lines that fail without running go first: they cost nothing
LineKey = tuple[str, int]  # (batch id, line number)


class GlobalPlanState:
    def __init__(self, planner: LinePlanner, store: BatchStore, owner: str) -> None:
        self.planner = planner
        self.store = store
        self.owner = owner
        self.task: asyncio.Task | None = None
        self.plans = 0
        self.samples: dict[LineKey, WorkItem] = {}
        self.observed: dict[Hashable, tuple[WorkItem, int]] = {}
        self.samples_back: set[LineKey] = set()

    def maybe_start(self, batches: ActiveBatches, done: Callable[[], None]) -> None:
        """Plan (in the background) when a running batch is not in the plan yet, or when every
        output-length sample is back; batches still being validated or assigned are waited for,
        so batches submitted together are planned together. ``done`` runs when a plan ends."""
        if self.task is not None:
            if not self.task.done():
                return
            if not self.task.cancelled() and self.task.exception() is not None:
                logger.error("planning the batches failed; trying again", exc_info=self.task.exception())
            self.task = None
        if batches.settling():
            return
        plannable = batches.plannable()
        if plannable and (self._samples_done() or any(not batch.planned for batch in plannable)):
            self.task = asyncio.create_task(self._plan(plannable))
            self.task.add_done_callback(lambda _task: done())

    def _samples_done(self) -> bool:
        return bool(self.samples) and self.samples_back >= self.samples.keys()

    def line_done(self, key: LineKey, outcome: LineOutcome) -> None:
        if key in self.samples:
            self.samples_back.add(key)
            if outcome.ok:
                self.observed[key] = (self.samples[key], outcome.usage.completion_tokens)

    async def _plan(self, batches: list[ActiveBatch]) -> None:
        store, owner = self.store, self.owner
        if not self.plans and not self.samples:
            unplanned = await asyncio.gather(*(asyncio.to_thread(store.unplanned_lines, batch.id) for batch in batches))
            if not any(unplanned):  # a restart: the store already holds the plan
                self._adopt(batches)
                return
        items: list[WorkItem] = []
        places: dict[str, list[tuple[int, int, Placement | None]]] = defaultdict(list)
        for batch in batches:
            prompts = await batch.prompts()
            for row in await asyncio.to_thread(store.pending_lines, batch.id):
                if row.error_code is None and row.line_number in prompts:
                    items.append(dataclasses.replace(prompts[row.line_number], key=(batch.id, row.line_number)))
                else:
                    places[batch.id].append((row.line_number, FAILS_AT_ONCE_RANK, None))
        samples_done = self._samples_done()
        plan = await asyncio.to_thread(self.planner.plan, items, self.observed if samples_done else None)
        for rank, (batch_id, number) in enumerate(plan.feed):
            places[batch_id].append((number, rank, plan.placements[(batch_id, number)]))
        for batch in batches:
            await asyncio.to_thread(store.set_plan, batch.id, owner, places.get(batch.id, []))
        sampled = set(plan.samples)
        self.samples = {item.key: item for item in items if item.key in sampled}
        self.samples_back = set()
        if samples_done:
            self.observed = {}
        self.plans += 1
        logger.info("planned %d lines of %d batches (%d samples first, memory share %.2f)", len(plan.feed),
                    len(batches), len(plan.samples), plan.memory_share)
        self._adopt(batches)

    @staticmethod
    def _adopt(batches: list[ActiveBatch]) -> None:
        for batch in batches:
            batch.planned = True
            batch.reread()
