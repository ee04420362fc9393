"""Sending a runner's lines to its workers: each slot takes the next line of its queue in the feed
whenever its window (`server.window`) has room, so the scheduler always has the fronts of both plan
sides to choose from, without holding the whole batch. Lines run at most once in effect: a result is
committed only if its line is still pending, so a line that a dead worker did finish after all is
not counted twice.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections import Counter
from collections.abc import Callable

from sgl_blend.batch_lines.outcome import WorkerUnreachable
from sgl_blend.offline import offline_routing_key
from sgl_blend.server.active import ActiveBatch, ActiveBatches
from sgl_blend.server.assignment import Slot
from sgl_blend.server.feed import Feed, LineKey
from sgl_blend.server.planning import PlanKeeper
from sgl_blend.server.results import LineResult, ResultWriter
from sgl_blend.server.store import LineRow
from sgl_blend.server.window import colocated_window, lines_in_flight
from sgl_blend.server.workers import Worker, WorkerPool

logger = logging.getLogger(__name__)
ABORT_ROUNDS, ABORT_ROUND_S = 30, 1.0
# The most lines one fill starts: each line's first step (its request read, handed to the
# engine) runs in the loop step after, so a window of thousands opened at once would hold the
# event loop -- and every API request and online request on it -- for as long as all of them take.
FILL_SLICE = 128


class Dispatcher:
    """``max_inflight``: every slot's window (None: sized from what the engine runs at once, or
    for a co-locating engine from what it runs now)."""

    def __init__(
        self,
        pool: WorkerPool,
        feed: Feed,
        plan_keeper: PlanKeeper,
        writer: ResultWriter,
        batches: ActiveBatches,
        *,
        max_inflight: int | None,
        wake: Callable[[], None],
    ) -> None:
        self.pool, self.feed, self.plan_keeper, self.writer, self.batches = pool, feed, plan_keeper, writer, batches
        self.max_inflight = max_inflight
        self.wake = wake
        self._inflight: Counter[Slot] = Counter()
        # A co-locating engine's slots: the window set at the last look at its queue.
        self._colocated: dict[Slot, int] = {}
        # Request ids: the line's own, unique to this runner (a restarted one may find its
        # predecessor's requests still in a remote engine), without a syscall per line.
        self._rid_prefix = secrets.token_hex(4)
        self._tries = itertools.count()

    def window(self, worker: Worker, slot: Slot) -> int:
        """Lines ``slot`` of ``worker`` holds at once."""
        full = self._full_window(worker)
        return min(full, self._colocated.get(slot, full))

    def _full_window(self, worker: Worker) -> int:
        return lines_in_flight(worker.limits.concurrent(self.plan_keeper.mean_footprint), self.max_inflight)

    def resize(self) -> None:
        """Size each co-locating slot's window from its queue and running batch as its engine last
        reported them; the window holds until the next report."""
        self._colocated.clear()
        if self.max_inflight:
            return
        for worker in self.pool.ready():
            if not worker.limits.colocated:
                continue
            full = self._full_window(worker)
            for slot in worker.slots():
                load = worker.loads.get(slot.dp_rank or 0)
                if load is not None:
                    self._colocated[slot] = colocated_window(full, self._inflight[slot], load)

    def fill(self) -> bool:
        """Start lines until every ready slot's window is full or its queue is empty, at most
        `FILL_SLICE` of them (the runner is woken to start more); whether some slot had room and
        nothing to send (the plan should feed it sooner). Lines of a batch whose results cannot
        be written now (a full disk) keep their place and wait."""
        starving = False
        started = 0
        for worker in self.pool.ready():
            for slot in worker.slots():
                window = self.window(worker, slot)
                waiting: list[LineKey] = []
                while self._inflight[slot] < window:
                    if started >= FILL_SLICE:
                        self.wake()
                        break
                    key = self.feed.pop(slot)
                    if key is None:
                        starving = True
                        break
                    if self.writer.paused(key[0]):
                        waiting.append(key)
                    else:
                        started += self._start(key, worker, slot)
                self.feed.push_front(waiting, dict.fromkeys(waiting, slot))
        return starving

    def _start(self, key: LineKey, worker: Worker, slot: Slot) -> bool:
        """Whether the line started (one whose batch stopped meanwhile leaves the feed)."""
        batch = self.batches.get(key[0])
        placement = self.feed.take_placement(key)
        if batch is None or not batch.dispatching or key[1] not in batch.lines:
            return False
        line = batch.lines[key[1]]
        self._inflight[slot] += 1
        worker.inflight += 1
        task = asyncio.create_task(self._run_line(batch, worker, slot, line, placement))
        batch.inflight[line.line_number] = task

        def done(_task: asyncio.Task) -> None:
            self._inflight[slot] -= 1
            worker.inflight -= 1
            batch.inflight.pop(line.line_number, None)
            batch.requests.pop(line.line_number, None)
            self.wake()

        task.add_done_callback(done)
        return True

    async def _run_line(self, batch: ActiveBatch, worker: Worker, slot: Slot, line: LineRow, placement) -> None:
        key = (batch.id, line.line_number)
        prepared = batch.prepared.line(line.byte_offset, line.byte_length)
        rid = f"{batch.id}-{line.line_number}-{self._rid_prefix}{next(self._tries)}"
        batch.requests[line.line_number] = (worker.url, rid)
        custom_id = line.custom_id
        assert custom_id is not None, "only valid lines run, and a valid line has its custom_id"
        try:
            outcome = await self.pool.send(
                worker, custom_id, prepared, offline_routing_key(batch.id, placement), rid, slot.dp_rank
            )
        except WorkerUnreachable:
            # never ran: first in line again, on its slot while the worker lives (else it moves)
            self.feed.push_front([key], {key: slot}, {key: placement} if placement else None)
            return
        if outcome.aborted and batch.closing:
            return  # stopped by our own abort: the line never finished
        self.plan_keeper.line_done(key, outcome)
        batch.result_in(line.line_number)
        self.writer.put(LineResult(batch.id, line.line_number, outcome))

    async def abort_inflight(self, batch: ActiveBatch) -> None:
        """Abort until nothing is in flight: a request SGLang has not registered yet ignores an
        abort, so each round aborts whatever is still running. Lines that finish meanwhile are
        kept; aborted ones stay unfinished. Connections are dropped only as a last resort."""
        for _round in range(ABORT_ROUNDS):
            if not batch.inflight:
                return
            await self.pool.abort(batch.requests.values())
            if batch.inflight:  # every line may have ended while the aborts went out
                await asyncio.wait(list(batch.inflight.values()), timeout=ABORT_ROUND_S)
        leftover = list(batch.inflight.values())
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
