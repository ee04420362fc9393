"""`sgl-blend run-batch`: an offline job over an OpenAI batch file, run by the Batch API's own runner
inside the server the job starts.

The job is one batch in a store of its own beside the output (``OUT.sgl-blend/``: SQLite and the
batch's prepared lines). The job's server is started with the Batch API on that store, the job's
input, output and error files named in it as the batch's files, so its runner -- the code that runs
a batch submitted to ``/v1/batches``, in the server's own process -- takes the batch up as soon as
it starts: validation, planning, output-length samples, DP assignment, running the lines
in-process and exactly-once result writing are all the runner's. This process only follows the
batch's progress in the store and stops the server at the end. Results are appended to the output
and error files the user named and committed in the store, so a re-run of the same command --
after Ctrl-C, SIGTERM or a kill -9 of every process -- cuts each file back to what was committed
and runs only the lines not done: nothing lost, nothing twice. A job that is already finished, or
whose input has no lines, is answered without starting a server.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sgl_blend.batch_lines.lines import DEFAULT_MAX_LINE_BYTES, RUN_BATCH_ENDPOINT, RUN_BATCH_URLS
from sgl_blend.batch_lines.outcome import LineUsage
from sgl_blend.emulation.clock_reader import JobTime
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.server.ids import new_batch_id, new_file_id
from sgl_blend.server.store import TERMINAL_STATUSES, BatchRow, BatchStore, FileRow
from sgl_blend.server.validation import FileRejected, LineLimits, count_requests

STORE_SUFFIX = ".sgl-blend"
POLL_S = 0.5
# A job has no completion window; this is the one its batch row records.
JOB_WINDOW_S = 100 * 365 * 24 * 3600
_HASH_CHUNK = 1 << 20


class JobRefused(RuntimeError):
    """The job cannot run: its input file has no requests (``empty_file``), or is not the one the
    job's store was made for (``input_changed``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code


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


@dataclass(frozen=True)
class EmulatedJob:
    """A job's time on an emulated device (`sgl_blend.emulation.clock_reader.job_time`)."""

    device: str
    time: JobTime
    # The real-time pacer's account (`emulation.realtime`: its factor, and how far the host fell
    # behind the device), None when forwards returned at once.
    realtime: dict[str, Any] | None = None


@dataclass
class JobTotals:
    """What one run of a job did. ``skipped``: lines an earlier run had finished; ``not_run``:
    lines still unfinished when this run stopped (Ctrl-C, the engine gone), left for a re-run;
    ``already_finished``: the job had ended before this run, which started no server.
    ``wall_seconds``: this machine's time; on an emulated GPU ``emulated`` holds the job's time on
    the emulated device, which its rates are reported over."""

    completed: int = 0
    failed: int = 0
    skipped: int = 0
    not_run: int = 0
    usage: LineUsage = field(default_factory=LineUsage)
    wall_seconds: float = 0.0
    emulated: EmulatedJob | None = None
    already_finished: bool = False

    @property
    def cached_tokens(self) -> int:
        return self.usage.cached_tokens

    @property
    def seconds(self) -> float:
        return self.emulated.time.seconds if self.emulated else self.wall_seconds

    def summary(self) -> dict[str, Any]:
        emulated = self.emulated
        job_time = emulated.time if emulated else None
        return {
            "completed": self.completed,
            "failed": self.failed,
            "skipped_already_done": self.skipped,
            "not_run_engine_unreachable": self.not_run,
            "already_finished": self.already_finished,
            **self.usage.report(self.seconds),
            "emulated": emulated is not None,
            "device": emulated.device if emulated else None,
            "idle_seconds": round(job_time.idle_seconds, 3) if job_time else None,
            "device_seconds": round(job_time.device_seconds, 3) if job_time else None,
            "late_seconds": round(job_time.late_seconds, 3) if job_time else None,
            "seconds_with_lateness": round(job_time.seconds_with_lateness, 3) if job_time else None,
            "realtime": emulated.realtime if emulated else None,
            "wall_seconds": round(self.wall_seconds, 2),
        }


@dataclass(frozen=True)
class JobOptions:
    """``max_inflight``: the lines handed to the engine at once, per DP rank (None: the window the
    runner sizes from the engine, `server.window`); ``max_line_bytes``: the longest line that
    runs (a longer one fails alone)."""

    max_inflight: int | None = None
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    show_progress: bool = True


def open_job(files: JobFiles) -> BatchRow:
    """The job's batch: the one its store holds, or a new one for this input (its output folder
    made). Raises `JobRefused` for an input with no requests or another job's store."""
    files.output.parent.mkdir(parents=True, exist_ok=True)
    files.errors.parent.mkdir(parents=True, exist_ok=True)
    try:
        count_requests(files.input, LineLimits(RUN_BATCH_URLS, sys.maxsize))
    except FileRejected as rejected:
        raise JobRefused(rejected.code, f"{files.input}: {rejected.message}") from None
    store = BatchStore.open("", files.store_dir)
    try:
        return _job_batch(store, files)
    finally:
        store.close()


def job_config(files: JobFiles, row: BatchRow, options: JobOptions) -> BatchApiConfig:
    """The Batch API the job's server runs: on the job's store, the job's own files named in it."""
    return BatchApiConfig(
        data_dir=files.store_dir,
        max_file_lines=sys.maxsize,
        max_line_bytes=options.max_line_bytes,
        max_inflight=options.max_inflight,
        named={row.input_file_id: files.input, row.output_blob: files.output, row.error_blob: files.errors},
    )


def finished_totals(files: JobFiles, row: BatchRow) -> JobTotals:
    """A job that ended before this run: what it did, from its store."""
    return JobTotals(skipped=row.completed + row.failed, usage=_usage(row), already_finished=True)


def follow_job(files: JobFiles, start: BatchRow, alive: Callable[[], bool], show_progress: bool) -> JobTotals:
    """Follow the job's batch in its store, with a progress bar, until it ends or its server is
    no longer ``alive``; Ctrl-C (KeyboardInterrupt) passes to the caller, which stops the server."""
    began = time.monotonic()
    reader = BatchStore.open("", files.store_dir, lock=False)
    bar = tqdm(
        total=start.total or None,
        initial=start.completed + start.failed,
        unit="req",
        disable=not show_progress,
        dynamic_ncols=True,
    )

    def current() -> BatchRow:
        row = reader.get_batch(start.id)
        assert row is not None, "a batch is never deleted"
        return row

    try:
        row = start
        while row.status not in TERMINAL_STATUSES and alive():
            time.sleep(POLL_S)
            row = current()
            _show(bar, row, start, time.monotonic() - began)
        row = current()
    finally:
        bar.close()
        reader.close()
    done_before = start.completed + start.failed
    usage = LineUsage(
        row.input_tokens - start.input_tokens,
        row.output_tokens - start.output_tokens,
        row.cached_tokens - start.cached_tokens,
    )
    return JobTotals(
        completed=row.completed - start.completed,
        failed=row.failed - start.failed,
        skipped=done_before,
        not_run=max(row.total - row.completed - row.failed, 0) if row.status not in TERMINAL_STATUSES else 0,
        usage=usage,
        wall_seconds=time.monotonic() - began,
    )


def _usage(row: BatchRow) -> LineUsage:
    return LineUsage(row.input_tokens, row.output_tokens, row.cached_tokens)


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
            raise JobRefused(
                "input_changed",
                f"{files.input} is not the input the job in {files.store_dir} was "
                "started with; remove that folder (and the output files) to start over",
            )
        return row
    for path in (files.output, files.errors):
        if path.exists() and path.stat().st_size:
            raise JobRefused(
                "output_exists",
                f"{path} exists but no job store ({files.store_dir}) accounts for "
                "it; remove it or write the output elsewhere",
            )
    now = int(time.time())
    input_id = new_file_id()
    store.add_file(FileRow(input_id, "batch", files.input.name, files.input.stat().st_size, now))
    row = BatchRow(
        new_batch_id(),
        RUN_BATCH_ENDPOINT,
        input_id,
        "job",
        "validating",
        now,
        now + JOB_WINDOW_S,
        output_blob=new_file_id(),
        error_blob=new_file_id(),
        metadata={"input_sha256": fingerprint},
    )
    store.add_batch(row)
    BlobDir(files.store_dir)  # the store's folders, before its server opens them
    return row


def _fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
