"""Executing batches: validation, line dispatch as offline work, expiry, cancellation, finalizing.

The runner lives in the HTTP server's event loop. It coordinates every unfinished batch it holds
the lease of, and sends each line to its assigned worker's own OpenAI route over HTTP with the
offline routing key, so the scheduler's BlendServe pool orders it among every other offline line
(`server.dispatch`). Nothing about a batch is held whole in memory: lines are read from the store in
chunks and from the input file by offset.

A batch's unfinished lines are assigned to the live slots of the workers (`server.workers`) when
the runner takes the batch up, by BlendServe's DP partition; a worker that stays unreachable for
``worker_grace_s`` is declared dead and its unfinished lines are assigned again over the slots
still alive.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Sequence

from sgl_blend.batch_lines.lines import DEFAULT_MAX_LINE_BYTES, endpoint_urls, error_record
from sgl_blend.batch_lines.sender import LineOutcome, LineUsage
from sgl_blend.server.active import ActiveBatch, ActiveBatches
from sgl_blend.server.assignment import Assigner, split_evenly
from sgl_blend.server.blobs import BlobDir, ResultFileDamaged
from sgl_blend.server.dispatch import FEED_CHUNK, Dispatcher
from sgl_blend.server.planning import GlobalPlanState
from sgl_blend.server.prepared import PreparedBatch
from sgl_blend.server.results import LineResult, ResultWriter
from sgl_blend.server.store import BatchRow, BatchStore, Conflict, FileRow, LeaseLost
from sgl_blend.server.validation import FileRejected, LineLimits, index_batch
from sgl_blend.server.workers import WORKER_GRACE_S, WorkerPool

if TYPE_CHECKING:
    from sgl_blend.batch_lines.plan import LinePlanner
    from sgl_blend.batch_lines.tokenize import LineTokenizer

logger = logging.getLogger(__name__)
OUTPUT_PURPOSE = "batch_output"
LEASE_S = 30.0
POLL_S = 0.5
HOUSEKEEPING_S = 60.0


class BatchRunner:
    """``tokenizer`` tokenises every line's prompt at validation, when a ``planner`` plans by them
    or the lines are spread over several slots; ``max_line_bytes`` is the longest line that runs."""

    def __init__(self, store: BatchStore, blobs: BlobDir, *, workers: Sequence[str], owner: str,
                 api_key: str | None = None, admin_api_key: str | None = None,
                 max_inflight: int = 1024, max_file_lines: int = 50_000, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 assigner: Assigner = split_evenly, poll_s: float = POLL_S, lease_s: float = LEASE_S,
                 worker_grace_s: float = WORKER_GRACE_S, planner: LinePlanner | None = None,
                 tokenizer: LineTokenizer | None = None) -> None:
        if planner is not None and tokenizer is None:
            raise ValueError("a runner that plans by prompts needs the served model's tokenizer")
        self.store = store
        self.blobs = blobs
        self.owner = owner
        self.max_file_lines = max_file_lines
        self.max_line_bytes = max_line_bytes
        self.poll_s = poll_s
        self.lease_s = lease_s
        self.tokenizer = tokenizer
        self.workers = WorkerPool(workers, max_inflight=max_inflight, api_key=api_key, admin_api_key=admin_api_key,
                                  grace_s=worker_grace_s, on_change=lambda: self.wake(refresh=False))
        self.batches = ActiveBatches()
        self._wake = asyncio.Event()
        self._refresh = True
        self._writer = ResultWriter(store, blobs, owner)
        self._global_plan = GlobalPlanState(planner, store, owner) if planner is not None else None
        self._dispatcher = Dispatcher(self.workers, store, self._writer, owner=owner, assigner=assigner,
                                      global_plan=self._global_plan, wake=lambda: self.wake(refresh=False))

    def wake(self, refresh: bool = True) -> None:
        """Look at the store again now (a batch was created or cancelled), not at the next poll."""
        self._refresh = self._refresh or refresh
        self._wake.set()

    async def run(self) -> None:
        """Coordinate batches until cancelled; then stop sending, commit what finished, release leases."""
        self.workers.open()
        writer_task = asyncio.create_task(self._writer.run())
        steal = self.store.exclusive
        next_claim = next_housekeeping = 0.0
        try:
            while True:
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
                    self._advance()
                    await self._dispatcher.fill(self.batches.dispatching())
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
        finally:
            await self._shutdown(writer_task)

    async def _shutdown(self, writer_task: asyncio.Task) -> None:
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

    # Taking batches up and letting them go

    async def _claim(self, steal: bool) -> None:
        rows = await asyncio.to_thread(self.store.claim_batches, self.owner, time.time(), self.lease_s, steal=steal)
        held = {row.id: row for row in rows}
        for batch_id in self.batches.ids():
            if batch_id not in held or batch_id in self._writer.lost_batches:
                self._drop(batch_id)  # a batch the writer let go is taken up afresh if still held
        for row in held.values():
            batch = self.batches.get(row.id)
            if batch is None:
                await self._adopt(row)
            elif batch.task is None:  # a running step keeps the row it reloads itself
                batch.row = row

    async def _adopt(self, row: BatchRow) -> None:
        """Take a batch up: cut its result files back to the committed lengths (anything past them
        was written by a run that died before committing); its lines are spread by `Dispatcher.assign`.
        A file shorter than its committed length lost committed results: the batch fails, saying so."""
        try:
            await asyncio.to_thread(self.blobs.truncate, row.output_blob, row.output_bytes)
            await asyncio.to_thread(self.blobs.truncate, row.error_blob, row.error_bytes)
        except ResultFileDamaged as damaged:
            logger.error("batch %s: %s", row.id, damaged)
            await asyncio.to_thread(self.store.fail_batch, row.id, self.owner, [damaged.as_batch_error()],
                                    int(time.time()))
            return
        self._writer.open(row.id, row.output_blob, row.error_blob, row.output_bytes, row.error_bytes)
        self.batches.add(ActiveBatch(row, PreparedBatch(self.blobs.prepared_dir(row.id)),
                                     planned=self._global_plan is None))

    def _drop(self, batch_id: str) -> None:
        batch = self.batches.pop(batch_id)
        for task in (*batch.inflight.values(), batch.task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        batch.prepared.close()
        self._writer.close(batch_id)

    # Lifecycle

    def _advance(self) -> None:
        """Start the next lifecycle step of every batch that has none running."""
        now = time.time()
        for batch in self.batches:
            if batch.task is not None:
                if not batch.task.done():
                    continue
                self._settle(batch)
            status = batch.row.status
            if status == "validating":
                step = self._validate(batch)
            elif status == "cancelling":
                step = self._close(batch, "cancelled")
            elif status == "finalizing":
                step = self._finish(batch, "completed")
            elif status == "in_progress" and now >= batch.row.expires_at:
                step = self._close(batch, "expired")
            elif status == "in_progress" and self._dispatcher.needs_assigning(batch):
                step = self._dispatcher.assign(batch)
            elif status == "in_progress" and self._drained(batch):
                step = self._finalize(batch)
            else:
                continue
            batch.task = asyncio.create_task(step)
            batch.task.add_done_callback(lambda _task: self.wake(refresh=False))
        if self._global_plan is not None:
            self._global_plan.maybe_start(self.batches, done=lambda: self.wake(refresh=False))

    def _settle(self, batch: ActiveBatch) -> None:
        task, batch.task = batch.task, None
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, LeaseLost):
            logger.warning("%s", error)
            self._drop(batch.id)
        elif error is not None:
            logger.error("batch %s: %s", batch.id, error, exc_info=error)

    def _drained(self, batch: ActiveBatch) -> bool:
        return (bool(batch.feeds) and all(feed.empty for feed in batch.feeds.values()) and not batch.inflight
                and self._writer.pending(batch.id) == 0)

    async def _validate(self, batch: ActiveBatch) -> None:
        row = batch.row
        try:
            if await asyncio.to_thread(self.store.clear_lines, row.id, self.owner):
                total = await asyncio.to_thread(self._index_lines, row)
                await asyncio.to_thread(self.store.start_batch, row.id, self.owner, total, int(time.time()))
        except FileRejected as rejected:
            await asyncio.to_thread(self.store.fail_batch, row.id, self.owner, [rejected.as_batch_error()],
                                    int(time.time()))
        except FileNotFoundError:
            error = FileRejected("file_not_found", f"the input file {row.input_file_id} is gone")
            await asyncio.to_thread(self.store.fail_batch, row.id, self.owner, [error.as_batch_error()],
                                    int(time.time()))
        await self._reload(batch)
        if batch.row.status == "failed":
            self._drop(batch.id)

    def _index_lines(self, row: BatchRow) -> int:
        """Validate the batch (in a worker thread), tokenising its prompts when the plan or the
        spread over several slots reads them; the number of lines."""
        limits = LineLimits(endpoint_urls(row.endpoint), self.max_file_lines, self.max_line_bytes)
        tokenize = self._global_plan is not None or len(self.workers.live_slots()) > 1
        return index_batch(self.store, self.owner, row.id, self.blobs.path(row.input_file_id),
                           self.blobs.prepared_dir(row.id), limits, self.tokenizer if tokenize else None)

    async def _finalize(self, batch: ActiveBatch) -> None:
        if await asyncio.to_thread(self.store.pending_lines, batch.id, limit=1):
            # a line left its feed without a result (its worker died as it was reassigned)
            batch.reread()
            return
        await asyncio.to_thread(self.store.set_finalizing, batch.id, self.owner, int(time.time()))
        await self._reload(batch)
        if batch.row.status == "finalizing":
            await self._finish(batch, "completed")

    async def _close(self, batch: ActiveBatch, status: str) -> None:
        """Stop a batch early (``cancelled`` or ``expired``): abort its lines in flight, keep every
        finished one, and for ``expired`` record each line that never ran as ``batch_expired``."""
        batch.closing = True
        await self._dispatcher.abort_inflight(batch)
        await self._writer.drained(batch.id)
        if status == "expired":
            await self._expire_unfinished(batch)
        await self._finish(batch, status)

    async def _expire_unfinished(self, batch: ActiveBatch) -> None:
        after = 0
        while rows := await asyncio.to_thread(self.store.pending_lines, batch.id, after_line=after, limit=FEED_CHUNK):
            for row in rows:
                record = error_record(row.custom_id, "batch_expired",
                                      "the batch's completion window ended before this request ran", row.line_number)
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
        finished = await asyncio.to_thread(self.store.finish, row.id, self.owner, status, now,
                                           output if row.output_bytes else None, errors if row.error_bytes else None)
        if finished:
            self._drop(row.id)
            await asyncio.to_thread(self.blobs.delete_prepared, row.id)
        else:
            await self._reload(batch)

    async def _reload(self, batch: ActiveBatch) -> BatchRow:
        row = await asyncio.to_thread(self.store.get_batch, batch.id)
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
