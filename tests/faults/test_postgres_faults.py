"""The PostgreSQL store under database faults while a runner runs a batch: a restart with
``-m immediate`` (every backend killed, recovery from the WAL), and connections dropped after a
result commit was sent but before its reply. The runner reconnects through its pool, finds out from
the store whether each unanswered commit landed, and the batch completes with 0 violations."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest

from sgl_blend.launch.supervisor import ServerProcess
from tests.batch.conftest import API_KEY
from tests.batch.postgres import PostgresServer, new_database, start_postgres
from tests.faults.commit_drop_proxy import CommitDropProxy
from tests.faults.helpers import all_violations, finished, new_batch, opened, running
from tests.faults.runner_process import RunnerConfig
from tests.waiting import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.server]
LINES, MAX_TOKENS = 30, 8


@pytest.fixture()
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, since it is restarted under the runner."""
    server = start_postgres()
    yield server
    server.stop()


def test_postgres_restart_immediate_mid_batch(own_postgres: PostgresServer, batch_server: ServerProcess,
                                              tmp_path: Path) -> None:
    store_url, data_dir = new_database(own_postgres.url, "restarted"), tmp_path / "data"
    batch_id, custom_ids = new_batch(store_url, data_dir, LINES, MAX_TOKENS)
    config = RunnerConfig(store_url, data_dir, batch_server.base_url, API_KEY, owner="restart-runner",
                          log_path=tmp_path / "runner.log", max_inflight=2)
    with running(config) as runner, opened(store_url, data_dir) as store:
        for done in (3, 12):
            wait_for(lambda: store.get_batch(batch_id).completed >= done, f"{done} lines committed")
            own_postgres.restart_immediate()
        finished(runner, config)
    assert all_violations(store_url, data_dir, {batch_id: custom_ids}) == []


def test_commit_reply_lost_after_the_commit_landed(postgres_url: str, batch_server: ServerProcess,
                                                  tmp_path: Path) -> None:
    admin_port = int(re.search(r":(\d+)/", postgres_url).group(1))
    proxy = CommitDropProxy(admin_port, drops=3)
    try:
        direct = new_database(postgres_url, "dropped_replies")
        store_url = direct.replace(f":{admin_port}/", f":{proxy.port}/")
        data_dir = tmp_path / "data"
        batch_id, custom_ids = new_batch(direct, data_dir, LINES, MAX_TOKENS)
        config = RunnerConfig(store_url, data_dir, batch_server.base_url, API_KEY, owner="drop-runner",
                              log_path=tmp_path / "runner.log", max_inflight=2)
        with running(config) as runner:
            finished(runner, config)
    finally:
        proxy.close()
    assert proxy.dropped == 3
    assert config.log_path.read_text().count("the store says it landed") == 3
    assert all_violations(direct, data_dir, {batch_id: custom_ids}) == []
