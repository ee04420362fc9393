"""A hard kill of the whole server mid-batch, then a restart on the same data directory: the batch
completes with every custom_id exactly once, and the restarted server runs exactly the lines the
store had not committed. This test needs its own server, since it kills it."""

from __future__ import annotations

import pytest

from pathlib import Path

from sgl_blend.client import http
from sgl_blend.launch.supervisor import ServerProcess
from sgl_blend.server.store import BatchStore
from tests.batch.conftest import API_KEY, client_for, start_batch_server
from tests.batch.helpers import create_batch, mixed_lines, records, wait_until

pytestmark = pytest.mark.server


def offline_counts(server: ServerProcess) -> dict[str, int]:
    """What the server's scheduler has done with offline requests (the runner's lines), from `/server_info`."""
    state = http.server_info(server.base_url, API_KEY)["internal_states"][0]["sgl_blend"]
    return (state["offline"] or {}).get("counts") or {}


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
    assert before.status == "in_progress"

    # What survived the kill, read from the SQLite file as the restart will find it.
    store = BatchStore.open("", data_dir)
    try:
        committed = store.get_batch(batch_id).completed
        states = [line.state for line in store.lines(batch_id)]
    finally:
        store.close()
    assert states.count("completed") == committed and states.count("pending") == len(lines) - committed
    assert before.request_counts.completed <= committed < len(lines), "the kill came mid-batch"

    server = start_batch_server(tmp_path / "second", data_dir)
    try:
        client = client_for(server)
        batch = wait_until(client, batch_id)
        assert batch.status == "completed"
        assert batch.request_counts.model_dump() == {"total": len(lines), "completed": len(lines), "failed": 0}
        done = [record["custom_id"] for record in records(client, batch.output_file_id)]
        assert sorted(done) == sorted(line["custom_id"] for line in lines)
        assert batch.error_file_id is None
        # The restart sent each uncommitted line once, and nothing that was committed.
        counts = offline_counts(server)
        assert counts.get("submitted") == counts.get("finished") == len(lines) - committed, counts
    finally:
        server.stop()
