"""Writing finished lines to a batch's output and error files, exactly once, in group commits.

For each group: append the records, fsync the files, then commit in the store the lines' states,
the counters and the files' new lengths in one transaction. Bytes past a committed length belong
to no committed line, so a restart cuts them off and runs those lines again. One commit covers
every result that arrived while the previous one was syncing, which keeps the fsyncs few however
fast lines finish.

Only the batch's current coordinator can commit (the store fences every commit on its lease), but a
coordinator that lost its lease without knowing it may still append to the same files until its
next commit fails. So a writer appends only to a file that ends at its committed length, and checks
after the fsync that the file grew by exactly its own records; otherwise (`ForeignBytes`) it lets
the batch go, and the runner takes it up again only if the store says it still holds the lease,
cutting the files back to the store's committed lengths as any take-over does. A committed length
therefore never covers another runner's bytes, and only a lease holder ever cuts a file; rolling
back cuts only a file that still ends with this writer's own append.

A commit that raises may still have landed (a PostgreSQL connection dropped before the reply to
COMMIT). The writer then asks the store before anything else: the batch's committed lengths are
either its new ends (landed: done) or the old ones (not landed: roll back and try again), since
each commit moves at least one of them and only the lease holder commits. When the store cannot
say (unreachable for long, the lease gone, lengths neither), the writer lets the batch go and the
take-over re-reads everything from the store, cutting nothing that was committed.

A write the disk refuses (full, over quota, an I/O error) is rolled back and the batch pauses:
its finished lines stay here, nothing is sent again, the batch shows a ``disk_full`` error while
it waits (logged too, as the store may share the full disk), and the same records are written
once space is freed.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import BinaryIO

import orjson
from tenacity import RetryError, Retrying, stop_after_delay, wait_exponential

from sgl_blend.batch_lines.outcome import LineOutcome
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.kill_points import kill_point
from sgl_blend.server.store import AlreadyCommitted, BatchCommit, BatchStore, LeaseLost

logger = logging.getLogger(__name__)
RETRY_DELAY_S = 1.0
# How long a writer keeps asking the store whether a commit that raised landed.
VERIFY_S = 60.0
_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class LineResult:
    batch_id: str
    line_number: int
    outcome: LineOutcome


def _record_line(record: dict) -> bytes:
    """A record as one line of a result file; orjson, several times faster than json on the
    thousands of records a second a fast engine finishes, with json's answer for what it cannot
    encode (an integer past 64 bits)."""
    try:
        return orjson.dumps(record) + b"\n"
    except TypeError:
        return (json.dumps(record, ensure_ascii=False) + "\n").encode()


class ForeignBytes(RuntimeError):
    """Someone else appended to a result file while this writer did (a runner that lost its lease)."""


class _ResultFiles:
    """A batch's two result files, open for appending, with the lengths last committed."""

    def __init__(self, blobs: BlobDir, output_blob: str, error_blob: str, output_bytes: int, error_bytes: int) -> None:
        self.output: BinaryIO = blobs.open_append(output_blob)
        self.error: BinaryIO = blobs.open_append(error_blob)
        self.committed = (output_bytes, error_bytes)
        self._appended_to: list[int] | None = None

    def append(self, results: list[LineResult], commit: BatchCommit) -> None:
        """Write and fsync the records; raises `ForeignBytes`, or the `OSError` of a write or
        fsync the disk refused (`roll_back` then cuts whatever part of them reached the file)."""
        chunks = (bytearray(), bytearray())
        for result in results:
            data = _record_line(result.outcome.record)
            chunks[0 if result.outcome.ok else 1].extend(data)
            (commit.completed_lines if result.outcome.ok else commit.failed_lines).append(result.line_number)
            commit.input_tokens += result.outcome.usage.prompt_tokens
            commit.cached_tokens += result.outcome.usage.cached_tokens
            commit.output_tokens += result.outcome.usage.completion_tokens
        self._appended_to = None
        for handle, length in zip((self.output, self.error), self.committed):
            if os.fstat(handle.fileno()).st_size != length:
                raise ForeignBytes(f"{handle.name} does not end at its committed length {length}")
        self._appended_to = list(self.committed)
        for index, (handle, chunk) in enumerate(zip((self.output, self.error), chunks)):
            view = memoryview(chunk)
            while view:
                written = handle.write(view)
                self._appended_to[index] += written
                view = view[written:]
            os.fsync(handle.fileno())
            end = os.fstat(handle.fileno()).st_size
            if end != self.committed[index] + len(chunk):
                raise ForeignBytes(
                    f"{handle.name} grew by {end - self.committed[index]} bytes, {len(chunk)} of them ours"
                )
        commit.output_bytes, commit.error_bytes = self._appended_to

    def landed(self, commit: BatchCommit) -> None:
        self.committed = (commit.output_bytes, commit.error_bytes)
        self._appended_to = None

    def roll_back(self) -> None:
        """Cut the files back to what the store has committed, after a commit that did not land or
        a write that failed. Only a file that still ends where this writer's last append ended:
        otherwise the bytes past the committed length are not (only) its own, and are left for a
        lease holder's take-over to cut."""
        if self._appended_to is None:
            return
        for handle, length, end in zip((self.output, self.error), self.committed, self._appended_to):
            if end != length and os.fstat(handle.fileno()).st_size == end:
                handle.truncate(length)
        self._appended_to = None

    def close(self) -> None:
        self.output.close()
        self.error.close()


class ResultWriter:
    def __init__(self, store: BatchStore, blobs: BlobDir, owner: str) -> None:
        self.store = store
        self.blobs = blobs
        self.owner = owner
        self.lost_batches: set[str] = set()
        self._queue: asyncio.Queue[LineResult] = asyncio.Queue()
        self._pending: Counter[str] = Counter()
        self._files: dict[str, _ResultFiles] = {}
        self._paused: set[str] = set()
        self._changed = asyncio.Condition()
        self._committing: asyncio.Future | None = None

    def open(self, batch_id: str, output_blob: str, error_blob: str, output_bytes: int, error_bytes: int) -> None:
        """Start writing a batch's results after its files were cut back to the committed lengths."""
        self.close(batch_id)
        self.lost_batches.discard(batch_id)
        self._files[batch_id] = _ResultFiles(self.blobs, output_blob, error_blob, output_bytes, error_bytes)

    def close(self, batch_id: str) -> None:
        files = self._files.pop(batch_id, None)
        self._paused.discard(batch_id)
        if files is not None:
            files.close()

    def put(self, result: LineResult) -> None:
        self._pending[result.batch_id] += 1
        self._queue.put_nowait(result)

    def pending(self, batch_id: str) -> int:
        return self._pending[batch_id]

    def paused(self, batch_id: str) -> bool:
        """Whether the batch's results cannot be written now (the disk refused them): sending
        more of its lines would only pile up results that wait."""
        return batch_id in self._paused

    async def drained(self, batch_id: str) -> None:
        """Wait until every result of the batch handed to `put` has been committed (or dropped)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._pending[batch_id] == 0)

    async def run(self) -> None:
        """Commit groups until cancelled; a group already being committed completes first."""
        while True:
            group = [await self._queue.get()]
            while not self._queue.empty():
                group.append(self._queue.get_nowait())
            self._committing = asyncio.ensure_future(asyncio.to_thread(self._commit_group, group))
            retry = await asyncio.shield(self._committing)
            retried = {id(result) for result in retry}
            async with self._changed:
                for result in group:
                    if id(result) not in retried:
                        self._pending[result.batch_id] -= 1
                self._changed.notify_all()
            if retry:
                await asyncio.sleep(RETRY_DELAY_S)
                for result in retry:
                    self._queue.put_nowait(result)

    async def flush(self) -> None:
        """After `run` was cancelled: let its last commit end, then commit whatever is still queued
        (at shutdown, so that finished lines need not run again)."""
        if self._committing is not None:
            await asyncio.wait([self._committing])
        group = []
        while not self._queue.empty():
            group.append(self._queue.get_nowait())
        if group:
            await asyncio.to_thread(self._commit_group, group)

    def _commit_group(self, group: list[LineResult]) -> list[LineResult]:
        """Write and commit each batch's share; returns the results to try again later."""
        by_batch: dict[str, list[LineResult]] = defaultdict(list)
        for result in group:
            by_batch[result.batch_id].append(result)
        retry: list[LineResult] = []
        for batch_id, results in by_batch.items():
            files = self._files.get(batch_id)
            if files is not None and batch_id not in self.lost_batches:
                retry.extend(self._commit_batch(batch_id, files, results))
        return retry

    def _commit_batch(self, batch_id: str, files: _ResultFiles, results: list[LineResult]) -> list[LineResult]:
        """Write and commit one batch's results; those to try again later."""
        commit = BatchCommit(batch_id)
        try:
            files.append(results, commit)
            kill_point("results_synced")
            self.store.commit_results(self.owner, commit)
        except AlreadyCommitted as error:
            logger.error("dropping results delivered twice: %s", error)
            files.roll_back()
            return [result for result in results if result.line_number not in error.lines]
        except (LeaseLost, ForeignBytes) as error:
            self._let_go(batch_id, f"batch results not committed: {error}")
            return []
        except OSError as error:
            if self._files.get(batch_id) is not files:
                return []  # the batch was let go meanwhile: its lines stay unfinished and run again
            files.roll_back()
            self._pause(batch_id, error)
            return results
        except Exception as error:
            if self._files.get(batch_id) is not files:
                return []
            landed = self._landed(batch_id, files, commit)
            logger.warning(
                "committing %d results of %s raised (%s); the store says it %s",
                len(results),
                batch_id,
                error,
                {True: "landed", False: "did not land", None: "cannot tell"}[landed],
            )
            if landed is None:
                self._let_go(batch_id, "whether its last commit landed is unknown")
                return []
            if not landed:
                files.roll_back()
                return results
        files.landed(commit)
        self._resume(batch_id)
        return []

    def _landed(self, batch_id: str, files: _ResultFiles, commit: BatchCommit) -> bool | None:
        """Whether a commit that raised landed, from the batch's committed lengths in the store once
        the commit has ended there (`settled_batch`): True (the new ones), False (the old ones), None
        (the store cannot be read, another runner took the batch, or the lengths are neither)."""
        try:
            for attempt in Retrying(stop=stop_after_delay(VERIFY_S), wait=wait_exponential(multiplier=0.2, max=5.0)):
                with attempt:
                    row = self.store.settled_batch(batch_id)
        except RetryError:
            return None
        if row is None or row.owner != self.owner:
            return None
        lengths = (row.output_bytes, row.error_bytes)
        if lengths == (commit.output_bytes, commit.error_bytes):
            return True
        return False if lengths == files.committed else None

    def _let_go(self, batch_id: str, why: str) -> None:
        logger.warning("letting batch %s go: %s", batch_id, why)
        self.lost_batches.add(batch_id)
        self.close(batch_id)

    def _pause(self, batch_id: str, error: OSError) -> None:
        if batch_id in self._paused:
            return
        code = "disk_full" if error.errno in _FULL else "result_write_failed"
        message = (
            f"cannot write results: {error.strerror or error}; the batch is paused, its finished requests are"
            " kept and written once the data directory can take them"
        )
        self._paused.add(batch_id)
        logger.error("batch %s: %s", batch_id, message)
        try:  # the next commit clears it; a store on the same full disk may refuse it (the log has it)
            self.store.note_errors(
                batch_id, self.owner, [{"code": code, "message": message, "param": None, "line": None}]
            )
        except Exception as note_error:
            logger.warning("batch %s: the pause could not be shown in the store: %s", batch_id, note_error)

    def _resume(self, batch_id: str) -> None:
        if batch_id in self._paused:
            self._paused.discard(batch_id)
            logger.warning("batch %s: results written again; the batch goes on", batch_id)
