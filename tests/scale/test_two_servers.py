"""One batch over two real servers on loopback, its store in a real PostgreSQL: the coordinating
server spreads the lines over itself and a second server by BlendServe's partition, then the
second server is hard-killed mid-batch. Its unfinished lines move to the survivor: every line
completes, each exactly once. Two servers of its own, since it kills one.

Who ran what is read from state, not logs: the store records each line's worker (a moved line
gets the survivor's) and state, and the survivor's `/server_info` counts the offline requests its
scheduler finished."""

from __future__ import annotations

import pytest

from pathlib import Path

import openai

from sgl_blend.client import http
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.launch.supervisor import start_server
from sgl_blend.server.store import BatchStore
from tests.batch.conftest import new_database
from tests.batch.helpers import create_batch, records, wait_until
from tests.conftest import free_port
from tests.scale.lines import family_lines
from tests.waiting import wait_for

pytestmark = pytest.mark.server


def test_a_worker_killed_mid_batch_loses_and_duplicates_nothing(tmp_path: Path, postgres_url: str) -> None:
    store_url = new_database(postgres_url, "two_servers")
    worker = start_server("tiny-llama", ["--port", str(free_port())], log_path=tmp_path / "worker.log")
    coordinator = None
    store = BatchStore.open(store_url, tmp_path / "probe")
    try:
        config = BatchApiConfig(data_dir=tmp_path / "data", store_url=store_url,
                                workers=(worker.base_url,), worker_grace_s=2.0)
        coordinator = start_server("tiny-llama", ["--port", str(free_port()), "--enable-cache-report"],
                                   log_path=tmp_path / "coordinator.log", batch_api=config)
        client = openai.OpenAI(base_url=f"{coordinator.base_url}/v1", api_key="unused", max_retries=0)
        lines = family_lines(4, 6, short=2, long=160, prefix="kill")
        batch_id = create_batch(client, lines).id

        def on_worker(state: str | None = None) -> list[str]:
            return [line.custom_id for line in store.lines(batch_id)
                    if line.worker == worker.base_url and (state is None or line.state == state)]

        # Its short-answer family is done and committed, its long-answer family still running.
        wait_for(lambda: on_worker("completed"), "a line the worker ran to be committed")
        share = len(on_worker())
        worker.kill()
        assert 0 < share < len(lines), "the partition gave each server a share"

        batch = wait_until(client, batch_id)
        assert batch.status == "completed"
        assert batch.request_counts.model_dump() == {"total": len(lines), "completed": len(lines), "failed": 0}
        done = [record["custom_id"] for record in records(client, batch.output_file_id)]
        assert sorted(done) == sorted(line["custom_id"] for line in lines)  # each exactly once
        assert batch.error_file_id is None

        ran_on_worker = on_worker()
        assert ran_on_worker == on_worker("completed")  # the lines still on the dead worker are those it finished
        assert 0 < len(ran_on_worker) < share, "some of the dead worker's lines moved"
        # The survivor ran its own share and the lines that moved, each once.
        offline = http.server_info(coordinator.base_url)["internal_states"][0]["sgl_blend"]["offline"]
        assert offline["counts"]["finished"] == len(lines) - len(ran_on_worker), offline["counts"]
    finally:
        store.close()
        worker.stop()
        if coordinator is not None:
            coordinator.stop()
