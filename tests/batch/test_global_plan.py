"""Two batches taken up together are planned together: the plan made once both are read covers both
batches' lines (the lines fed while they were read were planned provisionally, in the same rank
space), kept in the store, fed to the scheduler in rank order through a narrow window.

The runner talks to the shared tiny-llama server (BlendServe policy; on this CPU the plan is the
prefix tree's DFS with one cursor). Both batches hold lines of the same few-shot families, so
only a joint plan puts a family's lines from both batches next to each other.
"""

from __future__ import annotations

import pytest

from pathlib import Path

from sqlalchemy import select

from sgl_blend.client import http
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import BatchStore
from sgl_blend.server.store_schema import batch_lines
from sgl_blend.batch_lines.plan import LinePlanner
from sgl_blend.batch_lines.tokenize import LineTokenizer
from sgl_blend.core.cost_model import CostModel, ModelSpec
from sgl_blend.models.registry import model_dir
from sgl_blend.launch.supervisor import ServerProcess
from sgl_blend.sglang_plugin.settings import configured_hardware
from tests.batch.conftest import API_KEY
from tests.batch.helpers import add_batch, chat_line, run_until

pytestmark = pytest.mark.server

FAMILIES = 6
PER_FAMILY = 8
WINDOW = 4


def family_lines(batch: str) -> list[dict]:
    shots = [" ".join(f"shot{family}-{word}" for word in range(120)) for family in range(FAMILIES)]
    lines = [chat_line(f"{batch}-f{family}-{index}", 2, f"{shots[family]} Question {batch}{index}?")
             for index in range(PER_FAMILY) for family in range(FAMILIES)]
    return lines


def test_two_batches_are_planned_together_and_fed_in_plan_order(batch_server: ServerProcess, tmp_path: Path) -> None:
    store, blobs = BatchStore.open("", tmp_path), BlobDir(tmp_path)
    batch_ids = [add_batch(store, blobs, family_lines(name)) for name in ("a", "b")]
    model = model_dir("tiny-llama")
    planner = LinePlanner(CostModel(ModelSpec.from_hf_dir(model), configured_hardware()))
    runner = BatchRunner(store, blobs, workers=[batch_server.base_url], owner="plan-runner", api_key=API_KEY,
                         max_inflight=WINDOW, planner=planner, tokenizer=LineTokenizer(model))

    run_until(runner, lambda: all(store.get_batch(batch_id).status == "completed" for batch_id in batch_ids),
              "both batches to complete")
    assert [store.get_batch(batch_id).completed for batch_id in batch_ids] == [FAMILIES * PER_FAMILY] * 2
    with store.db.read() as connection:
        rows = connection.execute(select(batch_lines.c.batch_id, batch_lines.c.line_number, batch_lines.c.custom_id,
                                         batch_lines.c.plan_rank, batch_lines.c.placement)).mappings().all()
    ranks = {(row["batch_id"], row["line_number"]): row for row in rows}
    assert all(row["plan_rank"] is not None and row["placement"] for row in rows), "the plan is in the store"
    assert len({row["plan_rank"] for row in rows}) == len(rows), "one rank space over both batches' lines"
    final = runner.plan_keeper.plans[-1]
    assert not final.provisional
    jointly = sorted((row for row in rows if row["plan_rank"] >= final.first_rank), key=lambda row: row["plan_rank"])
    assert {row["batch_id"] for row in jointly} == set(batch_ids), "the last plan ranks both batches' lines"
    families = [row["custom_id"].split("-")[1] for row in jointly]
    changes = sum(a != b for a, b in zip(families, families[1:]))
    assert changes <= FAMILIES - 1, f"each family's lines of both batches are adjacent: {families}"

    info = http.server_info(batch_server.base_url, API_KEY)
    admissions = info["internal_states"][0]["sgl_blend"]["offline"]["admissions"]
    admitted = []
    for _iteration, rid, _side, _position, _tokens, _cap in admissions:
        parts = rid.rsplit("-", 2)  # the runner's rids: BATCH-LINE-SUFFIX (other tests' lines share the server)
        if len(parts) == 3 and parts[1].isdigit() and (parts[0], int(parts[1])) in ranks:
            admitted.append(ranks[(parts[0], int(parts[1]))]["plan_rank"])
    assert len(admitted) == 2 * FAMILIES * PER_FAMILY
    # Lines in flight together may reach the scheduler in either order, nothing else may.
    displaced = [(index, rank) for index, rank in enumerate(sorted(admitted)) if abs(admitted.index(rank) - index) > WINDOW]
    assert not displaced, f"the scheduler admits in plan order: {admitted}"
    store.close()
