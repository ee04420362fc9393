"""Writing finished lines to a batch's output and error files, exactly once, in group commits.

For each group: append the records, flush and fsync the files, then commit in the store the lines'
states, the counters and the files' new lengths in one transaction. Bytes past a committed length
belong to no committed line, so a restart cuts them off and runs those lines again. One commit
covers every result that arrived while the previous one was syncing, which keeps the fsyncs few
however fast lines finish.

Only the batch's current coordinator can commit (the store fences every commit on its lease), but a
coordinator that lost its lease without knowing it may still append to the same files until its
next commit fails. So a writer appends only to a file that ends at its committed length, and checks
after the fsync that the file grew by exactly its own records; otherwise (`ForeignBytes`) it lets
the batch go, and the runner takes it up again only if the store says it still holds the lease,
cutting the files back to the store's committed lengths as any take-over does. A committed length
therefore never covers another runner's bytes, and only a lease holder ever cuts a file; rolling
back after a failed commit cuts only a file that still ends with this writer's own append.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import BinaryIO

from sgl_blend.batch_lines.sender import LineOutcome
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.store import AlreadyCommitted, BatchCommit, BatchStore, LeaseLost

logger = logging.getLogger(__name__)
RETRY_DELAY_S = 1.0


@dataclass(frozen=True)
class LineResult:
    batch_id: str
    line_number: int
    outcome: LineOutcome


class ForeignBytes(RuntimeError):
    """Someone else appended to a result file while this writer did (a runner that lost its lease)."""


class _ResultFiles:
    """A batch's two result files, open for appending, with the lengths last committed."""

    def __init__(self, blobs: BlobDir, output_blob: str, error_blob: str, output_bytes: int, error_bytes: int) -> None:
        self.output: BinaryIO = blobs.open_append(output_blob)
        self.error: BinaryIO = blobs.open_append(error_blob)
        self.committed = (output_bytes, error_bytes)
        self._appended_to: tuple[int, int] | None = None

    def append(self, results: list[LineResult], commit: BatchCommit) -> None:
        self._appended_to = None
        chunks = (bytearray(), bytearray())
        for result in results:
            data = (json.dumps(result.outcome.record, ensure_ascii=False) + "\n").encode()
            chunks[0 if result.outcome.ok else 1].extend(data)
            (commit.completed_lines if result.outcome.ok else commit.failed_lines).append(result.line_number)
            commit.input_tokens += result.outcome.usage.prompt_tokens
            commit.cached_tokens += result.outcome.usage.cached_tokens
            commit.output_tokens += result.outcome.usage.completion_tokens
        ends = []
        for handle, length in zip((self.output, self.error), self.committed):
            if os.fstat(handle.fileno()).st_size != length:
                raise ForeignBytes(f"{handle.name} does not end at its committed length {length}")
        for handle, length, chunk in zip((self.output, self.error), self.committed, chunks):
            handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
            ends.append(handle.tell())
            if ends[-1] != length + len(chunk):
                raise ForeignBytes(f"{handle.name} grew by {ends[-1] - length} bytes, {len(chunk)} of them ours")
        self._appended_to = (ends[0], ends[1])
        commit.output_bytes, commit.error_bytes = ends

    def roll_back(self) -> None:
        """Cut the files back to what the store has committed, after a commit that failed. Only a
        file that still ends where this writer's last append ended: otherwise the bytes past the
        committed length are not (only) its own, and are left for a lease holder's take-over to cut."""
        if self._appended_to is None:
            return
        for handle, length, end in zip((self.output, self.error), self.committed, self._appended_to):
            if os.fstat(handle.fileno()).st_size == end:
                handle.truncate(length)
                handle.flush()
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
        self._changed = asyncio.Condition()
        self._committing: asyncio.Future | None = None

    def open(self, batch_id: str, output_blob: str, error_blob: str, output_bytes: int, error_bytes: int) -> None:
        """Start writing a batch's results after its files were cut back to the committed lengths."""
        self.close(batch_id)
        self.lost_batches.discard(batch_id)
        self._files[batch_id] = _ResultFiles(self.blobs, output_blob, error_blob, output_bytes, error_bytes)

    def close(self, batch_id: str) -> None:
        files = self._files.pop(batch_id, None)
        if files is not None:
            files.close()

    def put(self, result: LineResult) -> None:
        self._pending[result.batch_id] += 1
        self._queue.put_nowait(result)

    def pending(self, batch_id: str) -> int:
        return self._pending[batch_id]

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
            if files is None or batch_id in self.lost_batches:
                continue
            commit = BatchCommit(batch_id)
            try:
                files.append(results, commit)
                self.store.commit_results(self.owner, commit)
                files.committed = (commit.output_bytes, commit.error_bytes)
            except AlreadyCommitted as error:
                logger.error("dropping results delivered twice: %s", error)
                files.roll_back()
                retry.extend(result for result in results if result.line_number not in error.lines)
            except (LeaseLost, ForeignBytes) as error:
                logger.warning("batch results not committed; letting the batch go: %s", error)
                self.lost_batches.add(batch_id)
                self.close(batch_id)
            except Exception:
                if self._files.get(batch_id) is not files:
                    continue  # the batch was let go meanwhile: its lines stay unfinished and run again
                logger.exception("committing results of %s failed; retrying", batch_id)
                files.roll_back()
                retry.extend(results)
        return retry
