"""`sgl-blend run-batch`: an offline job over an OpenAI batch file, run by the Batch API's own runner.

The job is one batch in a store of its own beside the output (``OUT.sgl-blend/``: SQLite and the
batch's prepared lines). Validation, planning, output-length samples, DP assignment, feeding and
exactly-once result writing are `sgl_blend.server.runner`'s, the code that runs a batch submitted to
``/v1/batches``; the runner lives in this process and sends the lines to a local server. Results
are appended straight to the output and error files the user named and committed in the store,
so a re-run of the same command -- after Ctrl-C, SIGTERM or a kill -9 of every process -- cuts each
file back to what was committed and runs only the lines not done: nothing lost, nothing twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from sgl_blend.core.cost_model import CostModel
from sgl_blend.batch_lines.plan import LinePlanner
from sgl_blend.batch_lines.tokenize import LineTokenizer
from sgl_blend.batch_lines.lines import DEFAULT_MAX_LINE_BYTES, RUN_BATCH_ENDPOINT
from sgl_blend.batch_lines.sender import LineUsage
from sgl_blend.emulation.clock_reader import JobTime
from sgl_blend.server.assignment import PrefixAssigner
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.ids import new_batch_id, new_file_id
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import TERMINAL_STATUSES, BatchRow, BatchStore, FileRow

STORE_SUFFIX = ".sgl-blend"
POLL_S = 0.5
# A job has no completion window; this is the one its batch row records.
JOB_WINDOW_S = 100 * 365 * 24 * 3600
_HASH_CHUNK = 1 << 20


class JobInputChanged(RuntimeError):
    """The input file is not the one the job's store was made for."""


def job_store_dir(output_path: Path) -> Path:
    """Where a job's store lives: beside its output file."""
    return output_path.with_name(output_path.name + STORE_SUFFIX)


@dataclass
class JobFiles:
    input: Path
    output: Path
    errors: Path

    @property
    def store_dir(self) -> Path:
        return job_store_dir(self.output)


@dataclass
class JobTotals:
    """What one run of a job did. ``skipped``: lines an earlier run had finished; ``not_run``:
    lines still unfinished when this run stopped (Ctrl-C, the engine gone), left for a re-run.
    ``wall_seconds``: this machine's time; on an emulated GPU ``emulated`` holds the job's time on
    the emulated device, which its rates are reported over."""

    completed: int = 0
    failed: int = 0
    skipped: int = 0
    not_run: int = 0
    usage: LineUsage = field(default_factory=LineUsage)
    wall_seconds: float = 0.0
    emulated: EmulatedJob | None = None

    @property
    def cached_tokens(self) -> int:
        return self.usage.cached_tokens

    @property
    def seconds(self) -> float:
        return self.emulated.time.seconds if self.emulated else self.wall_seconds

    def summary(self) -> dict[str, Any]:
        emulated = self.emulated
        return {
            "completed": self.completed,
            "failed": self.failed,
            "skipped_already_done": self.skipped,
            "not_run_engine_unreachable": self.not_run,
            **self.usage.report(self.seconds),
            "emulated": emulated is not None,
            "device": emulated.device if emulated else None,
            "idle_seconds": round(emulated.time.idle_seconds, 3) if emulated else None,
            "device_seconds": round(emulated.time.device_seconds, 3) if emulated else None,
            "realtime": emulated.realtime if emulated else None,
            "wall_seconds": round(self.wall_seconds, 2),
        }


@dataclass(frozen=True)
class EmulatedJob:
    """A job's time on an emulated device (`sgl_blend.emulation.clock_reader.job_time`)."""

    device: str
    time: JobTime
    # The real-time pacer's account (`emulation.realtime`: its factor, and how far the host fell
    # behind the device), None when forwards returned at once.
    realtime: dict[str, Any] | None = None


@dataclass(frozen=True)
class JobEngine:
    """The server a job's lines go to, and how the job plans for it: the served model's directory
    and the cost model of the device its scheduler prices with."""

    base_url: str
    model_path: str
    cost_model: CostModel
    api_key: str | None = None
    alive: Callable[[], bool] = lambda: True



@dataclass(frozen=True)
class JobOptions:
    """``max_inflight``: a cap on the lines handed to the engine at once (None: twice what it runs
    at once, `server.dispatch`); ``max_line_bytes``: the longest line
    that runs (a longer one fails alone)."""

    max_inflight: int | None = None
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    show_progress: bool = True


def run_job(files: JobFiles, engine: JobEngine, policy: str, options: JobOptions = JobOptions()) -> JobTotals:
    """Run (or resume) the job to its end, or until the engine goes away; Ctrl-C stops it with
    every finished line kept."""
    return asyncio.run(_run(files, engine, policy, options))


async def _run(files: JobFiles, engine: JobEngine, policy: str, options: JobOptions) -> JobTotals:
    store = BatchStore.open("", files.store_dir)
    try:
        row = await asyncio.to_thread(_job_batch, store, files)
        blobs = BlobDir(files.store_dir, named={row.input_file_id: files.input, row.output_blob: files.output,
                                                row.error_blob: files.errors})
        runner = BatchRunner(store, blobs, workers=[engine.base_url], owner=f"run-batch:{os.getpid()}",
                             api_key=engine.api_key, max_inflight=options.max_inflight, max_file_lines=sys.maxsize,
                             max_line_bytes=options.max_line_bytes, assigner=PrefixAssigner(engine.cost_model),
                             planner=LinePlanner.for_policy(policy, engine.cost_model),
                             tokenizer=LineTokenizer(engine.model_path))
        return await _follow(store, row, runner, engine, options.show_progress)
    finally:
        store.close()


async def _follow(store: BatchStore, start: BatchRow, runner: BatchRunner, engine: JobEngine,
                  show_progress: bool) -> JobTotals:
    """Run the runner until the batch ends or the engine goes away, showing progress."""
    began = time.monotonic()
    bar = tqdm(total=start.total or None, initial=start.completed + start.failed, unit="req",
               disable=not show_progress, dynamic_ncols=True)
    task = asyncio.create_task(runner.run())
    row = start
    try:
        while row.status not in TERMINAL_STATUSES and engine.alive() and not task.done():
            await asyncio.sleep(POLL_S)
            row = await asyncio.to_thread(store.get_batch, start.id)
            _show(bar, row, start, time.monotonic() - began)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        bar.close()
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()
    row = await asyncio.to_thread(store.get_batch, start.id)
    done_before = start.completed + start.failed
    usage = LineUsage(row.input_tokens - start.input_tokens, row.output_tokens - start.output_tokens,
                      row.cached_tokens - start.cached_tokens)
    return JobTotals(completed=row.completed - start.completed, failed=row.failed - start.failed,
                     skipped=done_before, not_run=max(row.total - row.completed - row.failed, 0)
                     if row.status not in TERMINAL_STATUSES else 0,
                     usage=usage, wall_seconds=time.monotonic() - began)


def _show(bar: tqdm, row: BatchRow, start: BatchRow, elapsed: float) -> None:
    if row.total and bar.total != row.total:
        bar.total = row.total
    bar.n = row.completed + row.failed
    tokens = row.input_tokens + row.output_tokens - start.input_tokens - start.output_tokens
    bar.set_postfix(tok_s=f"{tokens / max(elapsed, 1e-9):.0f}", failed=row.failed, refresh=False)
    bar.refresh()


def _job_batch(store: BatchStore, files: JobFiles) -> BatchRow:
    """The job's batch: the one its store holds, or a new one for this input. A store made for
    another input, or output files no store accounts for, stop the job with the reason."""
    fingerprint = _fingerprint(files.input)
    rows, _more = store.list_batches(after=None, limit=1)
    if rows:
        row = rows[0]
        if (row.metadata or {}).get("input_sha256") != fingerprint:
            raise JobInputChanged(f"{files.input} is not the input the job in {files.store_dir} was started with; "
                                  f"remove {files.store_dir} (and the output files) to start over")
        return row
    for path in (files.output, files.errors):
        if path.exists() and path.stat().st_size:
            raise JobInputChanged(f"{path} exists but no job store ({files.store_dir}) accounts for it; "
                                  "remove it or write the output elsewhere")
    now = int(time.time())
    input_id = new_file_id()
    store.add_file(FileRow(input_id, "batch", files.input.name, files.input.stat().st_size, now))
    row = BatchRow(new_batch_id(), RUN_BATCH_ENDPOINT, input_id, "job", "validating", now, now + JOB_WINDOW_S,
                   output_blob=new_file_id(), error_blob=new_file_id(), metadata={"input_sha256": fingerprint})
    store.add_batch(row)
    return row


def _fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
