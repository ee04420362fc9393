"""Sending a runner's batches to its workers: each batch's lines are spread over the live slots,
read from the store a chunk at a time per slot, and kept in flight through a wide window per
worker -- the scheduler can only order what it has been given. Lines run at most once in effect:
a result is committed only if its line is still pending, so a line that a dead worker did finish
after all is not counted twice.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Callable

from sgl_blend.batch_lines.lines import LineError, line_error_record
from sgl_blend.batch_lines.sender import LineOutcome, LineUsage, WorkerUnreachable
from sgl_blend.offline import offline_headers
from sgl_blend.server.active import ActiveBatch, Feed
from sgl_blend.server.assignment import Assigner, Slot
from sgl_blend.server.planning import GlobalPlanState
from sgl_blend.server.results import LineResult, ResultWriter
from sgl_blend.server.store import BatchStore, LineRow
from sgl_blend.server.workers import Worker, WorkerPool

logger = logging.getLogger(__name__)
FEED_CHUNK = 256
ABORT_ROUNDS, ABORT_ROUND_S = 30, 1.0


class Dispatcher:
    def __init__(self, pool: WorkerPool, store: BatchStore, writer: ResultWriter, *, owner: str,
                 assigner: Assigner, global_plan: GlobalPlanState | None, wake: Callable[[], None]) -> None:
        self.pool, self.store, self.writer = pool, store, writer
        self.owner, self.assigner, self.global_plan, self.wake = owner, assigner, global_plan, wake

    def needs_assigning(self, batch: ActiveBatch) -> bool:
        """A batch not spread yet, or with lines on a worker that died, while some slot is alive."""
        if not self.pool.live_slots():
            return False
        return not batch.feeds or any(not self.pool[slot.worker].live for slot in batch.feeds)

    async def assign(self, batch: ActiveBatch) -> None:
        """Spread the batch's unfinished lines over the live slots: all of them the first time,
        afterwards those of dead workers; then read every slot's share afresh."""
        slots = self.pool.live_slots()
        lines = await asyncio.to_thread(self.store.pending_lines, batch.id)
        if batch.feeds:
            dead = {slot.worker for slot in batch.feeds if not self.pool[slot.worker].live}
            lines = [line for line in lines if line.worker in dead]
            logger.warning("batch %s: moving %d unfinished lines of %s to %s", batch.id, len(lines),
                           ", ".join(sorted(dead)), ", ".join(sorted({slot.worker for slot in slots})))
        prompts = await batch.prompts()
        assignment = await asyncio.to_thread(self.assigner, lines, slots, prompts)
        await asyncio.to_thread(self.store.assign, batch.id, self.owner, assignment)
        batch.feeds = {slot: Feed() for slot in slots}

    async def fill(self, batches: list[ActiveBatch]) -> None:
        """Fill every worker's window: in global plan order across the batches when they are
        planned, else taking lines from the batches in turn."""
        window = self.pool.max_inflight
        batches = [batch for batch in batches if not self.writer.paused(batch.id)]
        for worker in self.pool.ready():
            slots = worker.slots()
            if self.global_plan is not None:
                await self._fill_planned(worker, batches, slots)
                continue
            while worker.inflight < window:
                started = 0
                for batch in batches:
                    for slot in slots:
                        feed = batch.feeds.get(slot)
                        if feed is None:
                            continue
                        if not feed.buffer and not feed.retry and not feed.exhausted:
                            await self._refill(batch, slot, feed)
                        line = feed.next()
                        if line is not None and worker.inflight < window and batch.dispatching:
                            self._start_line(batch, worker, line)
                            started += 1
                if not started:
                    break

    async def _fill_planned(self, worker: Worker, batches: list[ActiveBatch], slots: list[Slot]) -> None:
        """Start, while the worker's window has room, the line with the lowest plan rank at the
        head of any batch's feed for its slots (the plan ranks all running batches together)."""
        while worker.inflight < self.pool.max_inflight:
            best: tuple[int, ActiveBatch, Feed] | None = None
            for batch in batches:
                for slot in slots:
                    feed = batch.feeds.get(slot)
                    if feed is None or not batch.dispatching:
                        continue
                    if feed.peek() is None and not feed.exhausted:
                        await self._refill(batch, slot, feed)
                    head = feed.peek()
                    if head is not None and (best is None or (head.plan_rank or 0) < best[0]):
                        best = (head.plan_rank or 0, batch, feed)
            if best is None:
                return
            _rank, batch, feed = best
            self._start_line(batch, worker, feed.next())

    async def _refill(self, batch: ActiveBatch, slot: Slot, feed: Feed) -> None:
        by_plan = self.global_plan is not None
        rows = await asyncio.to_thread(self.store.pending_lines, batch.id, after_line=feed.after_line,
                                       limit=FEED_CHUNK, slot=slot, after_rank=feed.after_rank if by_plan else None)
        if rows:
            feed.after_line, feed.after_rank = rows[-1].line_number, rows[-1].plan_rank or 0
        else:
            feed.exhausted = True
        feed.buffer.extend(row for row in rows if row.line_number not in batch.inflight)

    def _start_line(self, batch: ActiveBatch, worker: Worker, line: LineRow) -> None:
        worker.inflight += 1
        task = asyncio.create_task(self._run_line(batch, worker, line))
        batch.inflight[line.line_number] = task

        def done(_task: asyncio.Task) -> None:
            worker.inflight -= 1
            batch.inflight.pop(line.line_number, None)
            batch.requests.pop(line.line_number, None)
            self.wake()

        task.add_done_callback(done)

    async def _run_line(self, batch: ActiveBatch, worker: Worker, line: LineRow) -> None:
        if line.error_code is not None:
            error = LineError(line.line_number, line.custom_id, line.error_code, line.error_message or "")
            outcome = LineOutcome(False, line_error_record(error), LineUsage())
        else:
            request = batch.prepared.request(line.byte_offset, line.byte_length)
            rid = f"{batch.id}-{line.line_number}-{secrets.token_hex(4)}"
            batch.requests[line.line_number] = (worker.url, rid)
            try:
                outcome = await self.pool.send(worker, line.custom_id, request,
                                               offline_headers(batch.id, line.placement), rid, line.dp_rank)
            except WorkerUnreachable:
                feed = batch.feeds.get(Slot(worker.url, line.dp_rank))
                if feed is not None and worker.live:
                    feed.retry.append(line)
                else:  # its slot is gone: the line is another slot's now, and read again there
                    batch.reread()
                return
            if outcome.aborted and batch.closing:
                return  # stopped by our own abort: the line never finished
        if self.global_plan is not None:
            self.global_plan.line_done((batch.id, line.line_number), outcome)
        self.writer.put(LineResult(batch.id, line.line_number, outcome))

    async def abort_inflight(self, batch: ActiveBatch) -> None:
        """Abort until nothing is in flight: a request SGLang has not registered yet ignores an
        abort, so each round aborts whatever is still running. Lines that finish meanwhile are
        kept; aborted ones stay unfinished. Connections are dropped only as a last resort."""
        for _round in range(ABORT_ROUNDS):
            if not batch.inflight:
                return
            await self.pool.abort(batch.requests.values())
            await asyncio.wait(list(batch.inflight.values()), timeout=ABORT_ROUND_S)
        leftover = list(batch.inflight.values())
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
