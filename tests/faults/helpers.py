"""Batches for the fault tests, and running their runner processes to an end."""

from __future__ import annotations

import multiprocessing
import signal
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.store import BatchStore
from tests.batch.helpers import add_batch, chat_lines
from tests.batch.postgres import new_database
from tests.faults.invariants import violations
from tests.faults.runner_process import RunnerConfig, start_runner

# A guard against a hung runner, not a speed target: a runner finishes these batches in seconds.
RUNNER_LIMIT_S = 300.0
KILLED = -signal.SIGKILL


@contextmanager
def opened(store_url: str, data_dir: Path) -> Iterator[BatchStore]:
    """The store, opened only while no runner holds it (a SQLite store's directory lock is one runner's)."""
    store = BatchStore.open(store_url, data_dir)
    try:
        yield store
    finally:
        store.close()


def fresh_store(backend: str, postgres_url: str) -> str:
    """``backend``'s store URL: SQLite in the data directory (empty), or a new PostgreSQL database."""
    return "" if backend == "sqlite" else new_database(postgres_url, f"faults_{uuid.uuid4().hex[:12]}")


def new_batch(store_url: str, data_dir: Path, lines: int = 12, max_tokens: int = 3) -> tuple[str, list[str]]:
    """A batch in the store, as the routes would create it; its id and custom_ids."""
    content = chat_lines(lines, f"b{uuid.uuid4().hex[:8]}", max_tokens=max_tokens)
    with opened(store_url, data_dir) as store:
        batch_id = add_batch(store, BlobDir(data_dir), content)
    return batch_id, [line["custom_id"] for line in content]


@contextmanager
def running(config: RunnerConfig) -> Iterator[multiprocessing.Process]:
    """A runner process, killed on the way out if it is still there (a test that failed midway)."""
    process = start_runner(config)
    try:
        yield process
    finally:
        if process.is_alive():
            process.kill()
            process.join()


def finished(process: multiprocessing.Process, config: RunnerConfig) -> None:
    """Wait for a runner to finish every batch of its store, and say where its log is if it did not."""
    process.join(RUNNER_LIMIT_S)
    assert process.exitcode == 0, f"{config.owner} ended with {process.exitcode}; its log: {config.log_path}"


def run_to_the_end(config: RunnerConfig) -> None:
    with running(config) as process:
        finished(process, config)


def all_violations(store_url: str, data_dir: Path, batches: dict[str, list[str]]) -> list[str]:
    with opened(store_url, data_dir) as store:
        blobs = BlobDir(data_dir)
        return [problem for batch_id, ids in batches.items() for problem in violations(store, blobs, batch_id, ids)]
