"""Executing batches: validation, line dispatch as offline work, expiry, cancellation, finalizing.

The runner lives in the HTTP server's event loop. It coordinates every unfinished batch it holds
the lease of, and sends each line to its assigned worker's own OpenAI route over HTTP with the
offline routing key, so the scheduler's BlendServe pool orders it among every other offline line.
A wide window of lines per worker stays in flight across all in-progress batches, because the
scheduler can only order what it has been given. Nothing about a batch is held whole in memory:
lines are read from the store in chunks and from the input file by offset.

Workers are base URLs: this server, and any others `sgl-blend serve --batch-workers` names. Each
offers one slot per DP rank (its ``dp_size``, read from its ``/server_info``). A batch's unfinished
lines are assigned to the live slots when the runner takes the batch up, by BlendServe's DP
partition; a worker that stays unreachable for ``worker_grace_s`` is declared dead and its
unfinished lines are assigned again over the slots still alive. Lines run at most once in effect:
a result is committed only if its line is still pending, so a line that a dead worker did finish
after all is not counted twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import aiohttp

from sgl_blend.jobs.lines import LineError, error_record, line_error_record, parse_line
from sgl_blend.jobs.sender import (LineOutcome, LineUsage, WorkerUnreachable, abort_requests, open_session,
                                   send_line)
from sgl_blend.core.placement import Placement
from sgl_blend.offline import offline_headers
from sgl_blend.server.assignment import Assigner, Slot, split_evenly, worker_slots
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.planning import GlobalPlanState
from sgl_blend.server.results import LineResult, ResultWriter
from sgl_blend.server.store import BatchRow, BatchStore, Conflict, FileRow, LeaseLost, LineRow
from sgl_blend.server.validation import FileRejected, index_input_file

if TYPE_CHECKING:
    from sgl_blend.jobs.line_plan import LinePlanner

logger = logging.getLogger(__name__)
OUTPUT_PURPOSE = "batch_output"
FEED_CHUNK = 256
LEASE_S = 30.0
POLL_S = 0.5
HOUSEKEEPING_S = 60.0
MAX_WORKER_BACKOFF_S = 10.0
WORKER_GRACE_S = 15.0
PROBE_TIMEOUT_S = 10.0
ABORT_ROUNDS, ABORT_ROUND_S = 30, 1.0


@dataclass
class _Feed:
    """A batch's unfinished lines for one worker, fetched from the store a chunk at a time."""

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
class _ActiveBatch:
    row: BatchRow
    # one per slot the batch's lines are assigned to; empty until the batch is assigned
    feeds: dict[Slot, _Feed] = field(default_factory=dict)
    inflight: dict[int, asyncio.Task] = field(default_factory=dict)
    # line number -> (worker, SGLang request id) of each line being sent
    requests: dict[int, tuple[str, str]] = field(default_factory=dict)
    task: asyncio.Task | None = None
    closing: bool = False
    planned: bool = False

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def dispatching(self) -> bool:
        return self.row.status == "in_progress" and not self.closing and bool(self.feeds) and self.planned


@dataclass
class _Worker:
    url: str
    dp_size: int | None = None  # None: not known to be alive (not probed yet, or declared dead)
    inflight: int = 0
    down_until: float = 0.0
    backoff_s: float = 0.0
    failing_since: float | None = None

    @property
    def live(self) -> bool:
        return self.dp_size is not None

    def slots(self) -> list[Slot]:
        return worker_slots(self.url, self.dp_size) if self.dp_size is not None else []


class BatchRunner:
    def __init__(self, store: BatchStore, blobs: BlobDir, *, workers: Sequence[str], owner: str,
                 api_key: str | None = None, admin_api_key: str | None = None,
                 max_inflight: int = 1024, max_file_lines: int = 50_000,
                 assigner: Assigner = split_evenly, poll_s: float = POLL_S, lease_s: float = LEASE_S,
                 worker_grace_s: float = WORKER_GRACE_S, planner: LinePlanner | None = None) -> None:
        if not workers:
            raise ValueError("a batch runner needs at least one worker URL")
        self.store = store
        self.blobs = blobs
        self.owner = owner
        self.max_inflight = max_inflight
        self.max_file_lines = max_file_lines
        self.assigner = assigner
        self.poll_s = poll_s
        self.lease_s = lease_s
        self.worker_grace_s = worker_grace_s
        self.workers = {url: _Worker(url) for url in dict.fromkeys(workers)}
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # SGLang guards /abort_request with the admin key when one is set.
        abort_key = admin_api_key or api_key
        self._abort_auth = {"Authorization": f"Bearer {abort_key}"} if abort_key else {}
        self._active: dict[str, _ActiveBatch] = {}
        self._wake = asyncio.Event()
        self._refresh = True
        self._writer = ResultWriter(store, blobs, owner)
        self._session: aiohttp.ClientSession | None = None
        self._global_plan = GlobalPlanState(planner) if planner is not None else None

    def wake(self, refresh: bool = True) -> None:
        """Look at the store again now (a batch was created or cancelled), not at the next poll."""
        self._refresh = self._refresh or refresh
        self._wake.set()

    async def run(self) -> None:
        """Coordinate batches until cancelled; then stop sending, commit what finished, release leases."""
        self._session = open_session(self.max_inflight * len(self.workers), self._auth)
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
                    await self._probe_workers()
                    self._advance()
                    await self._dispatch()
                except Exception:
                    logger.exception("batch runner step failed; trying again")
                    next_claim = now + self.poll_s
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self._shutdown(writer_task)

    async def _shutdown(self, writer_task: asyncio.Task) -> None:
        tasks = [task for batch in self._active.values() for task in (*batch.inflight.values(), batch.task) if task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writer_task.cancel()
        await asyncio.gather(writer_task, return_exceptions=True)
        await self._writer.flush()
        for batch_id in list(self._active):
            self._writer.close(batch_id)
        await asyncio.to_thread(self.store.release, self.owner)
        if self._session is not None:
            await self._session.close()

    # Taking batches up and letting them go

    async def _claim(self, steal: bool) -> None:
        rows = await asyncio.to_thread(self.store.claim_batches, self.owner, time.time(), self.lease_s, steal=steal)
        held = {row.id: row for row in rows}
        for batch_id in list(self._active):
            if batch_id not in held or batch_id in self._writer.lost_batches:
                self._drop(batch_id)  # a batch the writer let go is taken up afresh if still held
        for row in held.values():
            batch = self._active.get(row.id)
            if batch is None:
                await self._adopt(row)
            elif batch.task is None:  # a running step keeps the row it reloads itself
                batch.row = row

    async def _adopt(self, row: BatchRow) -> None:
        """Take a batch up: cut its result files back to the committed lengths (anything past them
        was written by a run that died before committing); its lines are spread by `_assign`."""
        await asyncio.to_thread(self.blobs.truncate, row.output_blob, row.output_bytes)
        await asyncio.to_thread(self.blobs.truncate, row.error_blob, row.error_bytes)
        self._writer.open(row.id, row.output_blob, row.error_blob, row.output_bytes, row.error_bytes)
        self._active[row.id] = _ActiveBatch(row, planned=self._global_plan is None)

    def _live_slots(self) -> list[Slot]:
        return [slot for worker in self.workers.values() for slot in worker.slots()]

    def _needs_assigning(self, batch: _ActiveBatch) -> bool:
        """A batch not spread yet, or with lines on a worker that died, while some slot is alive."""
        if not self._live_slots():
            return False
        return not batch.feeds or any(not self.workers[slot.worker].live for slot in batch.feeds)

    async def _assign(self, batch: _ActiveBatch) -> None:
        """Spread the batch's unfinished lines over the live slots: all of them the first time,
        afterwards those of dead workers; then read every slot's share afresh."""
        slots = self._live_slots()
        lines = await asyncio.to_thread(self.store.pending_lines, batch.id)
        if batch.feeds:
            dead = {slot.worker for slot in batch.feeds if not self.workers[slot.worker].live}
            lines = [line for line in lines if line.worker in dead]
            logger.warning("batch %s: moving %d unfinished lines of %s to %s", batch.id, len(lines),
                           ", ".join(sorted(dead)), ", ".join(sorted({slot.worker for slot in slots})))
        input_file = batch.row.input_file_id

        def read_line(line: LineRow) -> bytes:
            return self.blobs.read_range(input_file, line.byte_offset, line.byte_length)

        assignment = await asyncio.to_thread(self.assigner, lines, slots, read_line)
        await asyncio.to_thread(self.store.assign, batch.id, self.owner, assignment)
        batch.feeds = {slot: _Feed() for slot in slots}

    def _reread(self, batch: _ActiveBatch) -> None:
        """Forget what the feeds buffered and read each slot's unfinished lines from the store again
        (lines in flight are skipped as they are read)."""
        batch.feeds = {slot: _Feed() for slot in batch.feeds}

    def _drop(self, batch_id: str) -> None:
        batch = self._active.pop(batch_id)
        for task in (*batch.inflight.values(), batch.task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._writer.close(batch_id)

    # Lifecycle

    def _advance(self) -> None:
        """Start the next lifecycle step of every batch that has none running."""
        now = time.time()
        for batch in list(self._active.values()):
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
            elif status == "in_progress" and self._needs_assigning(batch):
                step = self._assign(batch)
            elif status == "in_progress" and self._drained(batch):
                step = self._finalize(batch)
            else:
                continue
            batch.task = asyncio.create_task(step)
            batch.task.add_done_callback(lambda _task: self.wake(refresh=False))
        if self._global_plan is not None:
            self._global_plan.maybe_start(self)

    def _settle(self, batch: _ActiveBatch) -> None:
        task, batch.task = batch.task, None
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, LeaseLost):
            logger.warning("%s", error)
            self._drop(batch.id)
        elif error is not None:
            logger.error("batch %s: %s", batch.id, error, exc_info=error)

    def _drained(self, batch: _ActiveBatch) -> bool:
        return (bool(batch.feeds) and all(feed.empty for feed in batch.feeds.values()) and not batch.inflight
                and self._writer.pending(batch.id) == 0)

    async def _validate(self, batch: _ActiveBatch) -> None:
        row = batch.row
        now = int(time.time())
        started = None
        try:
            lines = index_input_file(self.blobs.path(row.input_file_id), row.endpoint, self.max_file_lines)
            started = await asyncio.to_thread(self.store.start_batch, row.id, self.owner, lines, now)
        except FileRejected as rejected:
            await asyncio.to_thread(self.store.fail_batch, row.id, self.owner, [rejected.as_batch_error()], now)
        except FileNotFoundError:
            error = FileRejected("file_not_found", f"the input file {row.input_file_id} is gone")
            await asyncio.to_thread(self.store.fail_batch, row.id, self.owner, [error.as_batch_error()], now)
        await self._reload(batch)
        if batch.row.status == "failed":
            self._drop(batch.id)

    async def _finalize(self, batch: _ActiveBatch) -> None:
        if await asyncio.to_thread(self.store.pending_lines, batch.id, limit=1):
            # a line left its feed without a result (its worker died as it was reassigned)
            self._reread(batch)
            return
        await asyncio.to_thread(self.store.set_finalizing, batch.id, self.owner, int(time.time()))
        await self._reload(batch)
        if batch.row.status == "finalizing":
            await self._finish(batch, "completed")

    async def _close(self, batch: _ActiveBatch, status: str) -> None:
        """Stop a batch early (``cancelled`` or ``expired``): abort its lines in flight, keep every
        finished one, and for ``expired`` record each line that never ran as ``batch_expired``."""
        batch.closing = True
        await self._abort_inflight(batch)
        await self._writer.drained(batch.id)
        if status == "expired":
            await self._expire_unfinished(batch)
        await self._finish(batch, status)

    async def _abort_inflight(self, batch: _ActiveBatch) -> None:
        """Abort until nothing is in flight: a request SGLang has not registered yet ignores an
        abort, so each round aborts whatever is still running. Lines that finish meanwhile are
        kept; aborted ones stay unfinished. Connections are dropped only as a last resort."""
        for _round in range(ABORT_ROUNDS):
            if not batch.inflight:
                return
            running = list(batch.requests.values())
            for worker in self.workers:
                rids = [rid for url, rid in running if url == worker]
                if rids:
                    await abort_requests(self._session, worker, rids, self._abort_auth)
            await asyncio.wait(list(batch.inflight.values()), timeout=ABORT_ROUND_S)
        leftover = list(batch.inflight.values())
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)

    async def _expire_unfinished(self, batch: _ActiveBatch) -> None:
        after = 0
        while rows := await asyncio.to_thread(self.store.pending_lines, batch.id, after_line=after, limit=FEED_CHUNK):
            for row in rows:
                record = error_record(row.custom_id, "batch_expired",
                                      "the batch's completion window ended before this request ran", row.line_number)
                self._writer.put(LineResult(batch.id, row.line_number, LineOutcome(False, record, LineUsage())))
            after = rows[-1].line_number
            await self._writer.drained(batch.id)

    async def _finish(self, batch: _ActiveBatch, status: str) -> None:
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
        else:
            await self._reload(batch)

    async def _reload(self, batch: _ActiveBatch) -> BatchRow:
        row = await asyncio.to_thread(self.store.get_batch, batch.id)
        if row.owner != self.owner:
            raise LeaseLost(f"batch {batch.id} is coordinated by {row.owner}, not {self.owner}")
        batch.row = row
        return row

    # Dispatch

    async def _dispatch(self) -> None:
        """Fill every worker's window: in global plan order across the in-progress batches when
        they are planned, else taking lines from the batches in turn."""
        batches = [batch for batch in self._active.values() if batch.dispatching]
        now = time.monotonic()
        for worker in self.workers.values():
            if not worker.live or worker.down_until > now:
                continue
            slots = worker.slots()
            if self._global_plan is not None:
                await self._dispatch_planned(worker, batches, slots)
                continue
            while worker.inflight < self.max_inflight:
                started = 0
                for batch in batches:
                    for slot in slots:
                        feed = batch.feeds.get(slot)
                        if feed is None:
                            continue
                        if not feed.buffer and not feed.retry and not feed.exhausted:
                            await self._refill(batch, slot, feed)
                        line = feed.next()
                        if line is not None and worker.inflight < self.max_inflight and batch.dispatching:
                            self._start_line(batch, worker, line)
                            started += 1
                if not started:
                    break

    async def _dispatch_planned(self, worker: _Worker, batches: list[_ActiveBatch], slots: list[Slot]) -> None:
        """Start, while the worker's window has room, the line with the lowest plan rank at the
        head of any batch's feed for its slots (the plan ranks all running batches together)."""
        while worker.inflight < self.max_inflight:
            best: tuple[int, _ActiveBatch, _Feed] | None = None
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

    async def _refill(self, batch: _ActiveBatch, slot: Slot, feed: _Feed) -> None:
        by_plan = self._global_plan is not None
        rows = await asyncio.to_thread(self.store.pending_lines, batch.id, after_line=feed.after_line,
                                       limit=FEED_CHUNK, slot=slot, after_rank=feed.after_rank if by_plan else None)
        if rows:
            feed.after_line, feed.after_rank = rows[-1].line_number, rows[-1].plan_rank or 0
        else:
            feed.exhausted = True
        feed.buffer.extend(row for row in rows if row.line_number not in batch.inflight)

    def _start_line(self, batch: _ActiveBatch, worker: _Worker, line: LineRow) -> None:
        worker.inflight += 1
        task = asyncio.create_task(self._run_line(batch, worker, line))
        batch.inflight[line.line_number] = task

        def done(_task: asyncio.Task) -> None:
            worker.inflight -= 1
            batch.inflight.pop(line.line_number, None)
            batch.requests.pop(line.line_number, None)
            self.wake(refresh=False)

        task.add_done_callback(done)

    async def _run_line(self, batch: _ActiveBatch, worker: _Worker, line: LineRow) -> None:
        if line.error_code is not None:
            error = LineError(line.line_number, line.custom_id, line.error_code, line.error_message or "")
            outcome = LineOutcome(False, line_error_record(error), LineUsage())
        else:
            raw = self.blobs.read_range(batch.row.input_file_id, line.byte_offset, line.byte_length)
            parsed = parse_line(raw.decode("utf-8"), line.line_number, (batch.row.endpoint,))
            if isinstance(parsed, LineError):
                outcome = LineOutcome(False, line_error_record(parsed), LineUsage())
            else:
                rid = f"{batch.id}-{line.line_number}-{secrets.token_hex(4)}"
                batch.requests[line.line_number] = (worker.url, rid)
                try:
                    placement = Placement.decode(line.placement) if line.placement else None
                    outcome = await send_line(self._session, worker.url, parsed, offline_headers(batch.id, placement),
                                              rid, dp_rank=line.dp_rank)
                except WorkerUnreachable as error:
                    self._worker_failed(worker, error)
                    feed = batch.feeds.get(Slot(worker.url, line.dp_rank))
                    if feed is not None and worker.live:
                        feed.retry.append(line)
                    else:  # its slot is gone: the line is another slot's now, and read again there
                        self._reread(batch)
                    return
                worker.backoff_s, worker.failing_since = 0.0, None
                if outcome.aborted and batch.closing:
                    return  # stopped by our own abort: the line never finished
        if self._global_plan is not None:
            self._global_plan.line_done((batch.id, line.line_number), outcome)
        self._writer.put(LineResult(batch.id, line.line_number, outcome))

    def _worker_failed(self, worker: _Worker, error: Exception) -> None:
        """Pause a worker that did not answer (down, or not listening yet) with a growing back-off;
        its lines wait and go again, since they never ran. One that stays unreachable for the
        grace period is declared dead, and `_advance` moves its lines to the live slots."""
        now = time.monotonic()
        worker.backoff_s = min(MAX_WORKER_BACKOFF_S, max(0.25, worker.backoff_s * 2))
        worker.down_until = now + worker.backoff_s
        worker.failing_since = worker.failing_since or now
        if worker.live and now - worker.failing_since >= self.worker_grace_s:
            logger.warning("worker %s unreachable for %.0f s; declaring it dead: %s", worker.url,
                           now - worker.failing_since, error)
            worker.dp_size = None
            self.wake(refresh=False)
        else:
            logger.info("worker unreachable, retrying in %.1f s: %s", worker.backoff_s, error)

    async def _probe_workers(self) -> None:
        """Ask each worker not known to be alive for its ``/server_info`` (at its back-off pace): one
        that answers is alive, with as many slots as it has DP ranks."""
        now = time.monotonic()
        waiting = [worker for worker in self.workers.values() if not worker.live and worker.down_until <= now]
        for worker, dp_size in zip(waiting, await asyncio.gather(*(self._dp_size(worker) for worker in waiting))):
            if dp_size is None:
                worker.backoff_s = min(MAX_WORKER_BACKOFF_S, max(0.25, worker.backoff_s * 2))
                worker.down_until = now + worker.backoff_s
                continue
            worker.dp_size, worker.backoff_s, worker.failing_since, worker.down_until = dp_size, 0.0, None, 0.0
            logger.info("worker %s is alive with %d DP rank(s)", worker.url, dp_size)

    async def _dp_size(self, worker: _Worker) -> int | None:
        try:
            async with self._session.get(worker.url + "/server_info",
                                         timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as response:
                if response.status != 200:
                    return None
                info = json.loads(await response.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
        return max(1, int(info.get("dp_size") or 1))

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
