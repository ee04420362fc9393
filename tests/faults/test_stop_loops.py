"""Cancel and SIGTERM, 100 times each, at random moments of a batch's life (validating, sending,
lines in flight): the runner stops within its lease every time, and nothing is lost or written
twice.

Runners of the test's own, in this process, on a SQLite store, sending to the shared real
tiny-llama server. A server's SIGTERM reaches its runner as the cancellation of the runner's task
(uvicorn runs the app's lifespan exit, `server.app.install_batch_api`), so that is what the
SIGTERM loop does: 100 runners in turn over the same store, each cancelled at a random moment and
awaited for at most the lease, the next taking over what the last left. The lease is the bound
because a runner still writing after its lease lapsed could race another server taking over.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest

from sgl_blend.launch.supervisor import ServerProcess
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.runner import LEASE_S, BatchRunner
from sgl_blend.server.store import BatchStore
from sgl_blend.server.store_rows import Conflict
from tests.batch.conftest import API_KEY
from tests.batch.helpers import add_batch, chat_lines, run_until
from tests.faults.invariants import violations
from tests.waiting import wait_for_async

pytestmark = [pytest.mark.faults, pytest.mark.server]
ROUNDS = 100
OWNER = "stop-loops"


def runner_for(store: BatchStore, blobs: BlobDir, server: ServerProcess) -> BatchRunner:
    return BatchRunner(store, blobs, workers=[server.base_url], owner=OWNER, api_key=API_KEY, max_inflight=8)


def test_cancel_100_times_stops_each_batch_within_the_lease(batch_server: ServerProcess, tmp_path: Path) -> None:
    store, blobs, moments = BatchStore.open("", tmp_path), BlobDir(tmp_path), random.Random(0)

    async def cancel_each_at_a_random_moment() -> list[str]:
        runner = runner_for(store, blobs, batch_server)
        task = asyncio.create_task(runner.run())
        batch_ids = []
        try:
            for index in range(ROUNDS):
                lines = chat_lines(4, f"cancel{index}", max_tokens=24)
                batch_ids.append(await asyncio.to_thread(add_batch, store, blobs, lines, owner=OWNER))
                runner.wake()
                await asyncio.sleep(moments.uniform(0, 0.4))
                try:
                    await asyncio.to_thread(store.request_cancel, batch_ids[-1], int(time.time()))
                except Conflict:  # the batch finished before its cancel came
                    pass
                runner.wake()
                await wait_for_async(lambda: store.get_batch(batch_ids[-1]).status in ("cancelled", "completed")
                                     and batch_ids[-1] not in runner.batches,  # nothing of it left running
                                     f"cancel {index} to end its batch within the lease", timeout_s=LEASE_S)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return batch_ids

    try:
        batch_ids = asyncio.run(cancel_each_at_a_random_moment())
        cancelled = sum(store.get_batch(batch_id).status == "cancelled" for batch_id in batch_ids)
        assert cancelled >= ROUNDS // 2, f"only {cancelled} of {ROUNDS} cancels came before their batch finished"
        for batch_id in batch_ids:
            row = store.get_batch(batch_id)
            written = _custom_ids(blobs, row.output_file_id) + _custom_ids(blobs, row.error_file_id)
            assert len(written) == len(set(written)) == row.completed + row.failed, batch_id
    finally:
        store.close()


def test_sigterm_100_times_stops_the_runner_within_the_lease(batch_server: ServerProcess, tmp_path: Path) -> None:
    store, blobs, moments = BatchStore.open("", tmp_path), BlobDir(tmp_path), random.Random(1)
    batches = {}
    for index in range(4):
        lines = chat_lines(40, f"term{index}", max_tokens=16)
        batches[add_batch(store, blobs, lines, owner=OWNER)] = [line["custom_id"] for line in lines]

    async def stop_runners_at_random_moments() -> None:
        for _round in range(ROUNDS):
            task = asyncio.create_task(runner_for(store, blobs, batch_server).run())
            await asyncio.sleep(moments.uniform(0, 0.6))
            task.cancel()
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), timeout=LEASE_S)

    try:
        asyncio.run(stop_runners_at_random_moments())
        run_until(runner_for(store, blobs, batch_server),
                  lambda: all(store.get_batch(batch_id).status == "completed" for batch_id in batches),
                  "the last runner to finish what 100 stopped ones left")
        assert [problem for batch_id, ids in batches.items() for problem in violations(store, blobs, batch_id, ids)] \
            == []
    finally:
        store.close()


def _custom_ids(blobs: BlobDir, file_id: str | None) -> list[str]:
    return [json.loads(line)["custom_id"] for line in blobs.path(file_id).read_bytes().splitlines()] if file_id else []
