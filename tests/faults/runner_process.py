"""A `BatchRunner` in a process of its own, for the fault tests: they SIGKILL it, SIGSTOP it or fill
its disk mid-batch, and start another on the same store.

The processes are forked from multiprocessing's fork server, which preloads this module with the
served model's tokenizer and the planner built: the kill test restarts its runner more than 30
times per store backend, and a fresh interpreter would spend seconds loading them each time. The
kill is still a real SIGKILL of a real process; `server.kill_points` lets a process send it to
itself at a named point.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path

from sgl_blend.batch_lines.plan import LinePlanner
from sgl_blend.batch_lines.tokenize import LineTokenizer
from sgl_blend.core.cost_model import CostModel, ModelSpec
from sgl_blend.models.registry import model_dir
from sgl_blend.server import kill_points
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import TERMINAL_STATUSES, BatchStore
from sgl_blend.sglang_plugin.settings import configured_hardware

POLL_S = 0.2
_MODEL = model_dir("tiny-llama")
PLANNER = LinePlanner(CostModel(ModelSpec.from_hf_dir(_MODEL), configured_hardware()))
TOKENIZER = LineTokenizer(_MODEL)
_ = TOKENIZER.tokenizer  # loaded here, in the fork server, once


@dataclass(frozen=True)
class RunnerConfig:
    """``kill_at``: a `kill_points` spec (``POINT:N``) or empty; ``lease_s``: the runner's lease."""

    store_url: str
    data_dir: Path
    worker: str
    api_key: str
    owner: str
    log_path: Path
    kill_at: str = ""
    lease_s: float = 30.0
    max_inflight: int = 4


def start_runner(config: RunnerConfig) -> multiprocessing.Process:
    """A runner process that runs until every batch in its store has finished, then exits 0."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    process = context.Process(target=_run, args=(config,), daemon=True)
    process.start()
    return process


def _run(config: RunnerConfig) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    logging.basicConfig(filename=config.log_path, level=logging.INFO,
                        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s")
    kill_points.arm(config.kill_at)
    store = BatchStore.open(config.store_url, config.data_dir)
    try:
        runner = BatchRunner(store, BlobDir(config.data_dir), workers=[config.worker], owner=config.owner,
                             api_key=config.api_key, max_inflight=config.max_inflight, lease_s=config.lease_s,
                             planner=PLANNER, tokenizer=TOKENIZER)
        asyncio.run(_until_finished(store, runner))
    finally:
        store.close()


async def _until_finished(store: BatchStore, runner: BatchRunner) -> None:
    task = asyncio.create_task(runner.run())
    try:
        while not task.done():
            rows, _more = await asyncio.to_thread(store.list_batches, after=None, limit=100)
            if rows and all(row.status in TERMINAL_STATUSES for row in rows):
                return
            await asyncio.sleep(POLL_S)
        task.result()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
