"""`sgl-blend run-batch`: an offline job over an OpenAI batch file, through a real server.

Lines go to the server as offline work, and results are appended to the output file the moment
each finishes. The output and error files are the job's only state: a re-run skips every
custom_id (and every failed line number) already written, so an interrupted job resumes without
running a line twice. With sgl-blend's policies (``blendserve``, ``dfs``) every unfinished line is
planned first, globally (`LinePlanner`), and the lines are fed in plan order, each carrying its
placement, so the scheduler admits by the whole batch's plan however few lines it holds. With
SGLang's own orderings (``lpm``, ``fcfs``) lines go in file order. On a server
with several DP ranks, the job's lines are cut into balanced shares of whole prefix subtrees
(BlendServe's DP partition) and each line is sent with its rank's ``routed_dp_rank``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, TextIO

import httpx
from tqdm import tqdm

from sgl_blend.client import http
from sgl_blend.jobs.lines import BatchLine, LineError, duplicate_id_error, line_error_record, parse_line
from sgl_blend.jobs.sender import LineUsage, WorkerUnreachable, send_line
from sgl_blend.offline import offline_headers

if TYPE_CHECKING:
    from sgl_blend.core.placement import Placement
    from sgl_blend.jobs.line_plan import LinePlanner

RUN_BATCH_URLS = ("/v1/chat/completions", "/v1/completions")


@dataclass
class JobTotals:
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    not_run: int = 0
    """Lines the engine never answered (it went away, e.g. on Ctrl-C): left unwritten for a re-run."""
    usage: LineUsage = field(default_factory=LineUsage)
    seconds: float = 0.0
    seen_ids: set[str] = field(default_factory=set)

    @property
    def cached_tokens(self) -> int:
        return self.usage.cached_tokens

    def summary(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "failed": self.failed,
            "skipped_already_done": self.skipped,
            "not_run_engine_unreachable": self.not_run,
            **self.usage.report(self.seconds),
        }


def finished_keys(*paths: Path) -> tuple[set[str], set[int]]:
    """custom_ids and failed line numbers already written by an earlier run of the same job."""
    ids: set[str] = set()
    lines: set[int] = set()
    for path in paths:
        if not path.exists():
            continue
        with path.open() as handle:
            for text in handle:
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    continue
                if record.get("custom_id"):
                    ids.add(record["custom_id"])
                elif isinstance(record.get("line"), int):
                    lines.add(record["line"])
    return ids, lines


def read_lines(path: Path) -> Iterator[BatchLine | LineError]:
    with path.open() as handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                yield parse_line(text, number, RUN_BATCH_URLS)


class JsonlAppender:
    """Appends one JSON record per line and flushes it, so a crash loses at most a partial line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: TextIO = path.open("a")
        if path.stat().st_size and not _ends_with_newline(path):
            self._handle.write("\n")

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


async def run_job(
    input_path: Path,
    output_path: Path,
    error_path: Path,
    base_url: str,
    *,
    api_key: str | None = None,
    max_inflight: int = 1024,
    job_id: str = "run-batch",
    show_progress: bool = True,
    dp_ranks: Mapping[int, int] | None = None,
    planner: LinePlanner | None = None,
) -> JobTotals:
    """``dp_ranks``: line number -> the DP rank that runs it (none: SGLang's DP controller picks).
    ``planner``: plan every unfinished line first and feed them in plan order, each with its
    placement (none: file order, for SGLang's own orderings)."""
    done_ids, done_lines = finished_keys(output_path, error_path)
    totals = JobTotals(seen_ids=set(done_ids))
    outputs, errors = JsonlAppender(output_path), JsonlAppender(error_path)
    runnable: dict[int, BatchLine] = {}
    invalid = 0
    for item in read_lines(input_path):
        if not _needs_run(item, done_ids, done_lines):
            totals.skipped += 1
        elif isinstance(item, LineError) or item.custom_id in totals.seen_ids:
            _record_invalid(item, totals, errors)
            invalid += 1
        else:
            totals.seen_ids.add(item.custom_id)
            runnable[item.line_number] = item
    bar = tqdm(total=len(runnable) + invalid, initial=invalid, unit="req", disable=not show_progress,
               dynamic_ncols=True)
    start = time.monotonic()
    try:
        async with http.async_client(key=api_key, max_connections=max_inflight) as client:
            sender = _LineFeed(client, base_url, job_id, max_inflight, totals, outputs, errors, bar, start, dp_ranks)
            if planner is None:
                await sender.send((line, None) for line in runnable.values())
            else:
                await _send_by_plan(planner, runnable, sender)
    finally:
        totals.seconds = time.monotonic() - start
        bar.close()
        outputs.close()
        errors.close()
    return totals


async def _send_by_plan(planner: LinePlanner, lines: dict[int, BatchLine], feed: _LineFeed) -> None:
    """Output-length samples first, as the paper runs them; once they are back, the rest of the
    batch re-planned with their lengths, in the plan's feed order."""
    items = await asyncio.to_thread(planner.work_items, lines)
    plan = await asyncio.to_thread(planner.plan, list(items.values()))
    if plan.samples:
        lengths = await feed.send((lines[key], plan.placements[key]) for key in plan.samples)
        sampled = set(plan.samples)
        observed = {key: (items[key], length) for key, length in lengths.items()}
        plan = await asyncio.to_thread(planner.plan, [item for key, item in items.items() if key not in sampled],
                                       observed)
    await feed.send((lines[key], plan.placements[key]) for key in plan.feed)


class _LineFeed:
    """Sends lines through a window of ``max_inflight`` and records each answer as it comes."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, job_id: str, max_inflight: int,
                 totals: JobTotals, outputs: JsonlAppender, errors: JsonlAppender, bar: tqdm, start: float,
                 dp_ranks: Mapping[int, int] | None) -> None:
        self.client, self.base_url, self.job_id = client, base_url, job_id
        self.window = asyncio.Semaphore(max_inflight)
        self.totals, self.outputs, self.errors, self.bar, self.start = totals, outputs, errors, bar, start
        self.dp_ranks = dp_ranks or {}

    async def send(self, lines: Iterable[tuple[BatchLine, Placement | None]]) -> dict[int, int]:
        """Send every line and wait for all; returns line number -> output tokens of those that
        completed."""
        lengths: dict[int, int] = {}
        tasks: set[asyncio.Task] = set()
        try:
            for line, placement in lines:
                await self.window.acquire()
                task = asyncio.create_task(self._send_one(line, placement, lengths))
                task.add_done_callback(self._done)
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        return lengths

    async def _send_one(self, line: BatchLine, placement: Placement | None, lengths: dict[int, int]) -> None:
        totals = self.totals
        try:
            outcome = await send_line(self.client, self.base_url, line, offline_headers(self.job_id, placement),
                                      dp_rank=self.dp_ranks.get(line.line_number))
        except WorkerUnreachable:
            totals.not_run += 1
            return
        if not outcome.ok:
            totals.failed += 1
            self.errors.write(outcome.record)
            return
        totals.completed += 1
        totals.usage += outcome.usage
        lengths[line.line_number] = outcome.usage.completion_tokens
        self.outputs.write(outcome.record)

    def _done(self, task: asyncio.Task) -> None:
        self.window.release()
        if not task.cancelled():
            self.bar.update(1)
            _show_rate(self.bar, self.totals, self.start)


def _needs_run(item: BatchLine | LineError, done_ids: set[str], done_lines: set[int]) -> bool:
    if item.custom_id and item.custom_id in done_ids:
        return False
    return not (item.custom_id is None and item.line_number in done_lines)


def _record_invalid(item: BatchLine | LineError, totals: JobTotals, errors: JsonlAppender) -> None:
    totals.failed += 1
    if isinstance(item, LineError):
        if item.custom_id is not None and item.custom_id in totals.seen_ids:
            item = LineError(item.line_number, None, item.code, item.message)
        errors.write(line_error_record(item))
    else:
        errors.write(line_error_record(duplicate_id_error(item.line_number, item.custom_id)))


def _show_rate(bar: tqdm, totals: JobTotals, start: float) -> None:
    elapsed = max(time.monotonic() - start, 1e-9)
    bar.set_postfix(tok_s=f"{(totals.usage.prompt_tokens + totals.usage.completion_tokens) / elapsed:.0f}",
                    failed=totals.failed, refresh=False)
