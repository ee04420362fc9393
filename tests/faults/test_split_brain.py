"""Split brain on a shared PostgreSQL store: the coordinating runner is stopped (SIGSTOP, which it
sends itself just after its second commit, so lines are still unfinished) with lines in flight,
past its lease, while a second runner takes the batch over and commits; then it is
resumed (SIGCONT) and finishes its lines as if nothing happened. Its fenced commits fail (the
batch's row says another runner holds it, and is locked while that one commits), its appends land
on files that no longer end where it thinks, and the batch completes with 0 violations."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from sgl_blend.launch.supervisor import ServerProcess
from tests.batch.conftest import API_KEY
from tests.faults.helpers import all_violations, finished, fresh_store, new_batch, opened, running
from tests.faults.runner_process import RunnerConfig
from tests.waiting import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.server]
LEASE_S = 3.0


def test_a_stalled_coordinator_resumes_after_a_take_over(postgres_url: str, batch_server: ServerProcess,
                                                         tmp_path: Path) -> None:
    store_url, data_dir = fresh_store("postgresql", postgres_url), tmp_path / "data"
    batch_id, custom_ids = new_batch(store_url, data_dir, lines=30, max_tokens=8)

    def config(owner: str) -> RunnerConfig:
        return RunnerConfig(store_url, data_dir, batch_server.base_url, API_KEY, owner=owner,
                            log_path=tmp_path / f"{owner}.log", lease_s=LEASE_S, max_inflight=2)

    first_config, second_config = replace(config("first"), kill_at="after_commit:2:stop"), config("second")
    with opened(store_url, data_dir) as store, running(first_config) as first:
        wait_for(lambda: stopped(first.pid), "the first runner to stop itself after its second commit")
        stalled_at = store.get_batch(batch_id).completed
        assert 0 < stalled_at < len(custom_ids)
        with running(second_config) as second:  # a failed wait leaves the stopped one to `running`'s SIGKILL
            wait_for(lambda: (row := store.get_batch(batch_id)).owner == "second" and row.completed > stalled_at,
                     "the second runner to take the batch over and commit")
            os.kill(first.pid, signal.SIGCONT)
            finished(second, second_config)
        finished(first, first_config)
    assert all_violations(store_url, data_dir, {batch_id: custom_ids}) == []


def stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (its state in ``/proc``, after the name's parentheses)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"
