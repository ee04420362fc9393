"""One batch over two real servers on loopback, its store in a real PostgreSQL: the coordinating
server spreads the lines over itself and a second server by BlendServe's partition, then the
second server is hard-killed mid-batch. Its unfinished lines move to the survivor: every line
completes, each exactly once. Two servers of its own, since it kills one."""

from __future__ import annotations

import time
from pathlib import Path

import openai

from sgl_blend.server.config import BatchApiConfig
from sgl_blend.launch.supervisor import start_server
from tests.batch.conftest import new_database
from tests.batch.helpers import WAIT_LIMIT_S, create_batch, records, wait_until
from tests.conftest import free_port
from tests.scale.lines import family_lines

POST = "POST /v1/chat/completions"


def answered(log: Path) -> int:
    return log.read_text(errors="replace").count(POST) if log.exists() else 0


def test_a_worker_killed_mid_batch_loses_and_duplicates_nothing(tmp_path: Path, postgres_url: str) -> None:
    worker_log, coordinator_log = tmp_path / "worker.log", tmp_path / "coordinator.log"
    worker = start_server("tiny-llama", ["--port", str(free_port())], log_path=worker_log)
    coordinator = None
    try:
        config = BatchApiConfig(data_dir=tmp_path / "data", store_url=new_database(postgres_url, "two_servers"),
                                workers=(worker.base_url,), worker_grace_s=2.0)
        coordinator = start_server("tiny-llama", ["--port", str(free_port()), "--enable-cache-report"],
                                   log_path=coordinator_log, batch_api=config)
        client = openai.OpenAI(base_url=f"{coordinator.base_url}/v1", api_key="unused", max_retries=0)
        lines = family_lines(4, 6, short=2, long=160, prefix="kill")
        batch_id = create_batch(client, lines).id
        deadline = time.monotonic() + WAIT_LIMIT_S
        while answered(worker_log) == 0 and time.monotonic() < deadline:  # its short-answer family is done
            time.sleep(0.1)
        worker.kill()
        killed_after = answered(worker_log)
        assert 0 < killed_after < len(lines) // 2

        batch = wait_until(client, batch_id)
        assert batch.status == "completed"
        assert batch.request_counts.model_dump() == {"total": len(lines), "completed": len(lines), "failed": 0}
        done = [record["custom_id"] for record in records(client, batch.output_file_id)]
        assert sorted(done) == sorted(line["custom_id"] for line in lines)  # each exactly once
        assert batch.error_file_id is None
        # the survivor ran its own half and what the dead worker left
        assert answered(coordinator_log) >= len(lines) - killed_after > len(lines) // 2
    finally:
        worker.stop()
        if coordinator is not None:
            coordinator.stop()
