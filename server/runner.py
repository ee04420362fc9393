"""Executing batches: validation, feeding the engine as offline work, expiry, cancellation, finalizing.

The runner lives in the HTTP server's event loop (`sgl-blend serve`, and the server `sgl-blend
run-batch` starts for its job). It coordinates every unfinished batch it holds the lease of, and
runs each line with the offline routing key and its placement, so the scheduler's BlendServe pool
orders it among every other offline line: through SGLang's own OpenAI handlers in this process
(`server.in_process`), or through another server's line route (`server.transports`).

A batch streams: validation reads its input twice in a worker thread -- once to count its lines (a
file with none, or too many, fails before anything is stored), then a chunk at a time, converting
each line once (which tokenises it) -- and hands each stored chunk to the feed at once
(`server.planning`), so the engine runs the first lines while the rest is still being read;
nothing about a batch is kept whole in memory beyond the lines not yet answered. Lines are spread
over the live slots of the workers (`server.workers`, one slot per DP rank) by BlendServe's DP
partition where their prompts are known; a worker that stays unreachable for ``worker_grace_s`` is
declared dead and its queued lines move to the slots still alive.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from sgl_blend.batch_lines.bodies import BodyCaps
from sgl_blend.batch_lines.lines import (
    DEFAULT_MAX_LINE_BYTES,
    LineError,
    endpoint_urls,
    error_record,
    line_error_record,
)
from sgl_blend.batch_lines.outcome import LineOutcome, LineUsage
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.server.active import ActiveBatch, ActiveBatches
from sgl_blend.server.assignment import Assigner, Slot, split_evenly
from sgl_blend.server.blobs import BlobDir, ResultFileDamaged
from sgl_blend.server.dispatch import Dispatcher
from sgl_blend.server.feed import Feed, LineKey
from sgl_blend.server.planning import PlanKeeper
from sgl_blend.server.prepared import PreparedBatch
from sgl_blend.server.results import LineResult, ResultWriter
from sgl_blend.server.store import BatchRow, BatchStore, Conflict, FileRow, LeaseLost, LineRow
from sgl_blend.server.validation import FileRejected, LineLimits, Prepare, as_read, index_batch, tokenised
from sgl_blend.server.window import QUEUE_LOOK_S
from sgl_blend.server.workers import WORKER_GRACE_S, WorkerPool

if TYPE_CHECKING:
    from sgl_blend.batch_lines.plan import LinePlanner
    from sgl_blend.batch_lines.tokenize import LineTokenizer
    from sgl_blend.server.in_process import InProcessEngine

logger = logging.getLogger(__name__)
OUTPUT_PURPOSE = "batch_output"
LEASE_S = 30.0
POLL_S = 0.5
HOUSEKEEPING_S = 60.0
EXPIRE_CHUNK = 1000
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# Batches read (validated) at once; more wait their turn.
READING_THREADS = 2


class ValidationStopped(Exception):
    """The batch was closed while it was being validated."""


class BatchRunner:
    """``engine``: the engine of the server the runner lives in, which runs the lines of worker
    ``workers[0]`` in-process and converts (so tokenises) every line at validation. A runner with
    no engine (a process of its own) reaches every worker through its line route, and tokenises
    lines with ``tokenizer`` when a ``planner`` plans by their prompts or they are spread over
    several slots. ``max_line_bytes`` is the longest line that runs and ``body_caps`` what one
    line may ask for; ``max_inflight`` is the lines each slot holds (None: sized from the engine,
    `server.window`)."""

    def __init__(
        self,
        store: BatchStore,
        blobs: BlobDir,
        *,
        workers: Sequence[str],
        owner: str,
        engine: InProcessEngine | None = None,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        max_inflight: int | None = None,
        max_file_lines: int = 50_000,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        assigner: Assigner = split_evenly,
        poll_s: float = POLL_S,
        lease_s: float = LEASE_S,
        worker_grace_s: float = WORKER_GRACE_S,
        planner: LinePlanner | None = None,
        tokenizer: LineTokenizer | None = None,
        body_caps: BodyCaps = BodyCaps(),
    ) -> None:
        if planner is not None and engine is None and tokenizer is None:
            raise ValueError("a runner that plans by prompts needs the served model's engine or tokenizer")
        self.store = store
        self.blobs = blobs
        self.owner = owner
        self.max_file_lines = max_file_lines
        self.max_line_bytes = max_line_bytes
        self.body_caps = body_caps
        self.poll_s = poll_s
        self.lease_s = lease_s
        self.engine = engine
        self.tokenizer = tokenizer
        self.assigner = assigner
        self.workers = WorkerPool(
            workers,
            engine=engine,
            local_url=workers[0] if workers else None,
            api_key=api_key,
            admin_api_key=admin_api_key,
            grace_s=worker_grace_s,
            on_change=lambda: self.wake(refresh=False),
        )
        self.batches = ActiveBatches()
        self.feed = Feed()
        # Reading a batch runs for seconds to minutes: off the event loop, and off its default
        # executor too, which SGLang's own request conversions and the API's store reads share (six
        # threads on a 2-core host). Plans have a thread of their own (`PlanKeeper`).
        self._reading = ThreadPoolExecutor(max_workers=READING_THREADS, thread_name_prefix="batch-reading")
        self.plan_keeper = PlanKeeper(
            self.feed, planner, store, owner, self._choose_slots, wake=lambda: self.wake(refresh=False)
        )
        self._wake = asyncio.Event()
        self._refresh = True
        self._writer = ResultWriter(store, blobs, owner)
        self._dispatcher = Dispatcher(
            self.workers,
            self.feed,
            self.plan_keeper,
            self._writer,
            self.batches,
            max_inflight=max_inflight,
            wake=lambda: self.wake(refresh=False),
        )

    def wake(self, refresh: bool = True) -> None:
        """Look at the store again now (a batch was created or cancelled), not at the next poll."""
        self._refresh = self._refresh or refresh
        self._wake.set()

    async def run(self) -> None:
        """Coordinate batches until cancelled; then stop sending, commit what finished, release leases."""
        writer_task = asyncio.create_task(self._writer.run())
        steal = self.store.exclusive
        next_claim = next_housekeeping = next_queue_look = 0.0
        try:
            while not (self.engine is not None and self.engine.stopping):
                now = time.monotonic()
                try:
                    if self._refresh or now >= next_claim:
                        self._refresh = False
                        await self._claim(steal)
                        steal = False
                        next_claim = now + self.poll_s
                    if now >= next_housekeeping:
                        await self._housekeeping()
                        next_housekeeping = now + HOUSEKEEPING_S
                    await self.workers.probe()
                    if now >= next_queue_look:
                        await self.workers.look_at_queues()
                        self._dispatcher.resize()
                        next_queue_look = now + QUEUE_LOOK_S
                    self._rebalance()
                    self._advance()
                    starving = self._dispatcher.fill()
                    self.plan_keeper.step(validating=self.batches.validating(), starving=starving)
                except Exception:
                    logger.exception("batch runner step failed; trying again")
                    next_claim = now + self.poll_s
                self._wake.clear()
                # Not asyncio.wait_for: on Python 3.11 it can swallow a cancel that lands in the
                # same loop step as the wake-up (CPython gh-86296), and the runner would never stop.
                try:
                    async with asyncio.timeout(self.poll_s):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            logger.info("the server is stopping: the batch runner stops, its unfinished lines run again on a restart")
        finally:
            await self._shutdown(writer_task)

    async def _shutdown(self, writer_task: asyncio.Task) -> None:
        for batch in self.batches:
            batch.closing = True
        tasks = self.batches.tasks()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writer_task.cancel()
        await asyncio.gather(writer_task, return_exceptions=True)
        await self._writer.flush()
        for batch in self.batches:
            batch.prepared.close()
            self._writer.close(batch.id)
        await asyncio.to_thread(self.store.release, self.owner)
        await self.workers.close()
        self._reading.shutdown(wait=False, cancel_futures=True)
        self.plan_keeper.close()

    # Taking batches up and letting them go

    async def _claim(self, steal: bool) -> None:
        rows = await asyncio.to_thread(self.store.claim_batches, self.owner, time.time(), self.lease_s, steal=steal)
        leased = {row.id: row for row in rows}
        for batch_id in self.batches.ids():
            if batch_id not in leased or batch_id in self._writer.lost_batches:
                self._drop(batch_id)  # a batch the writer let go is taken up afresh if still leased
        for row in leased.values():
            batch = self.batches.get(row.id)
            if batch is None:
                await self._adopt(row)
            elif batch.task is None:  # a step under way keeps the row it reloads itself
                batch.row = row

    async def _adopt(self, row: BatchRow) -> None:
        """Take a batch up: cut its result files back to the committed lengths (anything past them
        was written by a run that died before committing). A file shorter than its committed
        length lost committed results: the batch fails, saying so."""
        try:
            await asyncio.to_thread(self.blobs.truncate, row.output_blob, row.output_bytes)
            await asyncio.to_thread(self.blobs.truncate, row.error_blob, row.error_bytes)
        except ResultFileDamaged as damaged:
            logger.error("batch %s: %s", row.id, damaged)
            await asyncio.to_thread(
                self.store.fail_batch, row.id, self.owner, [damaged.as_batch_error()], int(time.time())
            )
            return
        self._writer.open(row.id, row.output_blob, row.error_blob, row.output_bytes, row.error_bytes)
        self.batches.add(ActiveBatch(row, PreparedBatch(self.blobs.prepared_dir(row.id))))

    def _drop(self, batch_id: str) -> None:
        batch = self.batches.pop(batch_id)
        batch.closing = True
        self.plan_keeper.remove_batch(batch_id)
        for task in (*batch.inflight.values(), batch.task, batch.validation):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        batch.prepared.close()
        self._writer.close(batch_id)

    # Lifecycle

    def _advance(self) -> None:
        """Start the next lifecycle step of every batch that has none running. Reading a batch's
        input runs beside its steps: a batch being read may be cancelled or expire."""
        now = time.time()
        for batch in self.batches:
            if batch.validation is not None and batch.validation.done():
                self._settle(batch, batch.validation)
                batch.validation = None
            if batch.task is not None:
                if not batch.task.done():
                    continue
                self._settle(batch, batch.task)
                batch.task = None
            if batch.id not in self.batches:
                continue
            status = batch.row.status
            if batch.closing:
                continue
            if status == "cancelling":
                step = self._close(batch, "cancelled")
            elif status == "finalizing":
                step = self._finish(batch, "completed")
            elif status in ("validating", "in_progress") and now >= batch.row.expires_at:
                step = self._close(batch, "expired")
            elif not batch.taken_up and status == "validating":
                batch.taken_up = True
                batch.validation = asyncio.create_task(self._validate(batch))
                batch.validation.add_done_callback(lambda _task: self.wake(refresh=False))
                continue
            elif not batch.taken_up:
                step = self._resume(batch)
            elif status == "in_progress" and batch.validation is None and self._drained(batch):
                step = self._finalize(batch)
            else:
                continue
            batch.task = asyncio.create_task(step)
            batch.task.add_done_callback(lambda _task: self.wake(refresh=False))

    def _settle(self, batch: ActiveBatch, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, LeaseLost):
            logger.warning("%s", error)
            if batch.id in self.batches:
                self._drop(batch.id)
        elif error is not None and not isinstance(error, ValidationStopped):
            logger.error("batch %s: %s", batch.id, error, exc_info=error)

    def _drained(self, batch: ActiveBatch) -> bool:
        return not batch.lines and not batch.inflight and self._writer.pending(batch.id) == 0

    async def _validate(self, batch: ActiveBatch) -> None:
        """Validate the batch's input, feeding each stored chunk's lines as it lands."""
        row = batch.row
        loop = asyncio.get_running_loop()

        def on_chunk(rows: list[LineRow], items: dict[int, WorkItem]) -> None:
            if batch.closing:
                raise ValidationStopped(batch.id)
            loop.call_soon_threadsafe(self._lines_ready, batch, rows, items)

        try:
            done = await asyncio.to_thread(self.store.clear_lines, row.id, self.owner)
            if done is not None:
                total = await loop.run_in_executor(self._reading, self._index_lines, row, done, on_chunk)
                await asyncio.to_thread(self.store.start_batch, row.id, self.owner, total, int(time.time()))
        except FileRejected as rejected:
            await self._fail(batch, rejected)
        except FileNotFoundError:
            await self._fail(batch, FileRejected("file_not_found", f"the input file {row.input_file_id} is gone"))
        except OSError as error:  # the prepared folder cannot be written (a full disk): say so, do not loop
            await self._fail(
                batch,
                FileRejected(
                    "disk_full" if error.errno in DISK_FULL else "validation_failed",
                    f"the batch's lines could not be prepared: {error}",
                ),
            )
        if not batch.closing:
            await self._reload(batch)

    def _index_lines(self, row: BatchRow, done: set[int], on_chunk) -> int:
        """Validate the batch (in a worker thread); the number of lines."""
        limits = LineLimits(endpoint_urls(row.endpoint), self.max_file_lines, self.max_line_bytes, self.body_caps)
        return index_batch(
            self.store,
            self.owner,
            row.id,
            self.blobs.path(row.input_file_id),
            self.blobs.prepared_dir(row.id),
            limits,
            self._preparer(),
            done=done,
            on_chunk=on_chunk,
        )

    def _preparer(self) -> Prepare:
        """Lines converted by the engine (its prompt ids are the plan's), or, with no engine,
        tokenised when the plan or the spread over several slots reads their prompts."""
        engine, tokenizer = self.engine, self.tokenizer
        if engine is not None:
            return lambda lines: [(converted.stored, converted.prompt_ids) for converted in engine.convert(lines)]
        if tokenizer is not None and self._reads_prompts():
            return tokenised(tokenizer)
        return as_read

    def _reads_prompts(self) -> bool:
        return (
            self.engine is not None or self.plan_keeper.line_planner is not None or len(self.workers.live_slots()) > 1
        )

    async def _fail(self, batch: ActiveBatch, rejected: FileRejected) -> None:
        await asyncio.to_thread(
            self.store.fail_batch, batch.id, self.owner, [rejected.as_batch_error()], int(time.time())
        )
        self._drop(batch.id)

    async def _resume(self, batch: ActiveBatch) -> None:
        """Take up a batch validated before (a restarted or another runner): its unfinished lines
        go back to the feed, in its stored plan where there is one."""
        batch.taken_up = True
        rows = await asyncio.to_thread(self.store.pending_lines, batch.id)
        items = await asyncio.to_thread(batch.prepared.prompts) if self._reads_prompts() else {}
        self._lines_ready(batch, [row for row in rows if row.plan_rank is None or row.placement is None], items)
        planned = sorted(
            (
                (row.plan_rank, row.placement, row)
                for row in rows
                if row.error_code is None and row.plan_rank is not None and row.placement is not None
            ),
            key=lambda entry: entry[0],
        )
        if planned:
            live = set(self.workers.live_slots())
            slot_of = {
                (batch.id, row.line_number): Slot(row.worker, row.dp_rank)
                for _, _, row in planned
                if row.worker is not None and Slot(row.worker, row.dp_rank) in live
            }
            keys = [(batch.id, row.line_number) for _, _, row in planned]
            slot_of.update(self._choose_slots([key for key in keys if key not in slot_of], {}))
            batch.lines.update((row.line_number, row) for _, _, row in planned)
            places = [(row.line_number, placement) for _, placement, row in planned]
            self.plan_keeper.resume(batch.id, places, [], items, slot_of)

    def _lines_ready(self, batch: ActiveBatch, rows: list[LineRow], items: dict[int, WorkItem]) -> None:
        """Validated (or resumed) lines: those that fail without running get their result now; the
        others go to the feed."""
        if batch.closing:
            return
        runnable = []
        for row in rows:
            if row.error_code is not None:
                error = LineError(row.line_number, row.custom_id, row.error_code, row.error_message or "")
                self._writer.put(
                    LineResult(batch.id, row.line_number, LineOutcome(False, line_error_record(error), LineUsage()))
                )
            else:
                batch.lines[row.line_number] = row
                runnable.append(row.line_number)
        self.plan_keeper.add(batch.id, runnable, items)
        self.wake(refresh=False)

    def _choose_slots(self, keys: Sequence[LineKey], items: Mapping[LineKey, WorkItem]) -> dict[LineKey, Slot]:
        """Where lines run: the one live slot, or each batch's lines spread over the live slots by
        the assigner (BlendServe's DP partition where the prompts are known); before any worker
        answered, the first worker's, to move once it does."""
        slots = self.workers.live_slots() or [Slot(next(iter(self.workers.workers)))]
        # The store says where each line runs once there is a choice (a line moved off a dead
        # worker is then recorded on the one that runs it).
        record = len(slots) > 1 or len(self.workers.workers) > 1
        by_batch: dict[str, list[int]] = defaultdict(list)
        for batch_id, number in keys:
            by_batch[batch_id].append(number)
        chosen: dict[LineKey, Slot] = {}
        for batch_id, numbers in by_batch.items():
            if len(slots) == 1:
                assignment = {slots[0]: numbers}
            else:
                prompts = {number: items[(batch_id, number)] for number in numbers if (batch_id, number) in items}
                assignment = self.assigner(numbers, slots, prompts)
            chosen.update(((batch_id, number), slot) for slot, share in assignment.items() for number in share)
            if record:
                self._store_assignment(batch_id, assignment)
        return chosen

    def _store_assignment(self, batch_id: str, assignment: Mapping[Slot, list[int]]) -> None:
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self.store.assign, batch_id, self.owner, assignment)
        )

        def report(done: asyncio.Task) -> None:
            if not done.cancelled() and done.exception() is not None:
                logger.warning("recording where lines run failed: %s", done.exception())

        task.add_done_callback(report)

    def _rebalance(self) -> None:
        """Lines queued on slots that are gone (a dead worker, a placeholder) move to the live ones:
        those queued when the slot went, and any that came back to it later (a line whose last try
        on the dead worker ended after the worker was declared dead)."""
        live = frozenset(self.workers.live_slots())
        stranded = self.feed.slots_with_lines() - live
        if not live or not stranded:
            return
        gone = [key for key in self.feed.queued() if self.feed.slot_of(key) in stranded]
        self.feed.move_slots(stranded, self._choose_slots(sorted(gone), self.plan_keeper.items))

    async def _finalize(self, batch: ActiveBatch) -> None:
        if await asyncio.to_thread(self.store.pending_lines, batch.id, limit=1):
            batch.taken_up = False  # a line left the feed without a result: take the rest up again
            return
        await asyncio.to_thread(self.store.set_finalizing, batch.id, self.owner, int(time.time()))
        await self._reload(batch)
        if batch.row.status == "finalizing":
            await self._finish(batch, "completed")

    async def _close(self, batch: ActiveBatch, status: str) -> None:
        """Stop a batch early (``cancelled`` or ``expired``): stop reading it, abort its lines in
        flight, keep every finished one, and for ``expired`` record each line that never ran as
        ``batch_expired``."""
        batch.closing = True
        self.plan_keeper.remove_batch(batch.id)
        if batch.validation is not None:
            await asyncio.gather(batch.validation, return_exceptions=True)
        await self._dispatcher.abort_inflight(batch)
        await self._writer.drained(batch.id)
        if status == "expired":
            await self._expire_unfinished(batch)
        await self._finish(batch, status)

    async def _expire_unfinished(self, batch: ActiveBatch) -> None:
        after = 0
        while rows := await asyncio.to_thread(self.store.pending_lines, batch.id, after_line=after, limit=EXPIRE_CHUNK):
            for row in rows:
                record = error_record(
                    row.custom_id,
                    "batch_expired",
                    "the batch's completion window ended before this request ran",
                    row.line_number,
                )
                self._writer.put(LineResult(batch.id, row.line_number, LineOutcome(False, record, LineUsage())))
            after = rows[-1].line_number
            await self._writer.drained(batch.id)

    async def _finish(self, batch: ActiveBatch, status: str) -> None:
        await self._writer.drained(batch.id)
        row = await self._reload(batch)
        now = int(time.time())
        expires_at = now + row.output_expires_after if row.output_expires_after else None
        output = FileRow(row.output_blob, OUTPUT_PURPOSE, f"{row.id}_output.jsonl", row.output_bytes, now, expires_at)
        errors = FileRow(row.error_blob, OUTPUT_PURPOSE, f"{row.id}_error.jsonl", row.error_bytes, now, expires_at)
        finished = await asyncio.to_thread(
            self.store.finish,
            row.id,
            self.owner,
            status,
            now,
            output if row.output_bytes else None,
            errors if row.error_bytes else None,
        )
        if finished:
            self._drop(row.id)
            await asyncio.to_thread(self.blobs.delete_prepared, row.id)
        else:
            await self._reload(batch)

    async def _reload(self, batch: ActiveBatch) -> BatchRow:
        row = await asyncio.to_thread(self.store.get_batch, batch.id)
        assert row is not None, "a batch is never deleted"
        if row.owner != self.owner:
            raise LeaseLost(f"batch {batch.id} is coordinated by {row.owner}, not {self.owner}")
        batch.row = row
        return row

    # Housekeeping

    async def _housekeeping(self) -> None:
        """Delete files whose ``expires_at`` passed, and uploads a crash abandoned."""
        await asyncio.to_thread(self.blobs.sweep_stale_partials)
        for row in await asyncio.to_thread(self.store.expired_files, int(time.time())):
            try:
                if await asyncio.to_thread(self.store.delete_file, row.id) is not None:
                    await asyncio.to_thread(self.blobs.delete, row.id)
            except Conflict:
                continue
