"""One real server with two DP ranks (`--dp-size 2`, tiny-llama on this CPU): the plugin runs in
each rank's scheduler, and batch work lands on the ranks BlendServe's DP partition chose (`run-batch`
runs its job through this same runner, inside the server it starts). One server for the module."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest

from sgl_blend.client import http
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.server.db import SQLITE_FILE
from sgl_blend.launch.supervisor import ServerProcess, start_server
from tests.batch.helpers import create_batch, jsonl, records, wait_until
from tests.conftest import free_port
from tests.scale.lines import family_lines, family_of

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("dp-server")
    server = start_server("tiny-llama", ["--port", str(free_port()), "--dp-size", "2", "--enable-cache-report"],
                          log_path=work / "server.log", batch_api=BatchApiConfig(data_dir=work / "data"))
    yield server
    server.stop()


def finished_by_rank(server: ServerProcess) -> dict[int, int]:
    """Offline requests each rank's scheduler (its own plugin pool) has finished so far."""
    states = [state["sgl_blend"] for state in http.server_info(server.base_url)["internal_states"]]
    return {state["dp_rank"]: ((state["offline"] or {}).get("counts") or {}).get("finished", 0) for state in states}


def test_the_plugin_runs_in_each_rank_scheduler(dp_server: ServerProcess) -> None:
    states = [state["sgl_blend"] for state in http.server_info(dp_server.base_url)["internal_states"]]
    assert sorted(state["dp_rank"] for state in states) == [0, 1]
    assert len({state["pid"] for state in states} | {dp_server.process.pid}) == 3


def test_batch_lines_run_on_the_ranks_the_partition_chose(dp_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{dp_server.base_url}/v1", api_key="unused", max_retries=0)
    lines = family_lines(4, 5, prefix="api")
    before = finished_by_rank(dp_server)
    batch = wait_until(client, create_batch(client, lines).id)
    assert batch.status == "completed" and batch.request_counts.completed == len(lines)
    assert sorted(record["custom_id"] for record in records(client, batch.output_file_id)) \
        == sorted(line["custom_id"] for line in lines)

    rank_of = assigned_ranks(dp_server, batch.id)
    assert set(rank_of.values()) == {0, 1}
    families = {}
    for custom_id, rank in rank_of.items():
        families.setdefault(family_of(custom_id), set()).add(rank)
    assert all(len(ranks) == 1 for ranks in families.values())  # every prefix family whole on one rank
    after = finished_by_rank(dp_server)
    assert {rank: after[rank] - before.get(rank, 0) for rank in (0, 1)} == Counter(rank_of.values())


def assigned_ranks(server: ServerProcess, batch_id: str) -> dict[str, int]:
    """custom_id -> the DP rank the runner recorded for it, read from the server's SQLite store."""
    data_dir = Path(server.log_path).parent / "data"
    with sqlite3.connect(f"file:{data_dir / SQLITE_FILE}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT custom_id, dp_rank FROM batch_lines WHERE batch_id = ?", (batch_id,)).fetchall()
    return dict(rows)
