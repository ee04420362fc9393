"""A hard kill of the whole server mid-batch, then a restart on the same data directory: the batch
completes with every custom_id exactly once. This test needs its own server, since it kills it."""

from __future__ import annotations

from pathlib import Path

from tests.batch.conftest import client_for, start_batch_server
from tests.batch.helpers import create_batch, mixed_lines, records, wait_until


def test_sigkill_mid_batch_then_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    lines = mixed_lines("durable")
    server = start_batch_server(tmp_path / "first", data_dir)
    try:
        client = client_for(server)
        batch_id = create_batch(client, lines).id
        before = wait_until(client, batch_id, lambda batch: batch.request_counts.completed >= 10)
        server.kill()  # SIGKILL to the whole process group, at whatever point the runner is
    finally:
        server.stop()
    assert before.status == "in_progress" and before.request_counts.completed < len(lines)

    server = start_batch_server(tmp_path / "second", data_dir)
    try:
        client = client_for(server)
        batch = wait_until(client, batch_id)
        assert batch.status == "completed"
        assert batch.request_counts.model_dump() == {"total": len(lines), "completed": len(lines), "failed": 0}
        done = [record["custom_id"] for record in records(client, batch.output_file_id)]
        assert sorted(done) == sorted(line["custom_id"] for line in lines)
        assert batch.error_file_id is None
    finally:
        server.stop()
    resumed = (tmp_path / "second" / "server.log").read_text().count("POST /v1/chat/completions")
    assert 0 < resumed <= len(lines) - before.request_counts.completed  # the restart ran what was left
