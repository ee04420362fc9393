"""The engine gets work while a batch is still being read, and a batch that joins is planned with the
lines already waiting without tokenising any line twice.

A runner of the test's own plans lines (BlendServe's planner) and feeds the shared tiny-llama
server; its tokenizer counts what it tokenises. Lines carry ~300-token prompts, so reading a few
thousand of them takes seconds while the first ones are answered in a fraction of one.
"""

from __future__ import annotations

import pytest

from pathlib import Path
from typing import Sequence

from sgl_blend.batch_lines.lines import BatchLine
from sgl_blend.batch_lines.plan import LinePlanner
from sgl_blend.batch_lines.tokenize import LineTokenizer
from sgl_blend.core.cost_model import CostModel, ModelSpec
from sgl_blend.launch.supervisor import ServerProcess
from sgl_blend.models.registry import model_dir
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import BatchStore
from sgl_blend.sglang_plugin.settings import configured_hardware
from tests.batch.conftest import API_KEY
from tests.batch.helpers import add_batch, chat_line, run_until

pytestmark = pytest.mark.server

FAMILIES = 12
WORDS = 150


class CountingTokenizer(LineTokenizer):
    """The served model's tokenizer, counting every line it tokenises (batch_id, line number)."""

    def __init__(self, model_path: Path) -> None:
        super().__init__(model_path)
        self.tokenised: list[int] = []

    def prompt_ids_batch(self, lines: Sequence[BatchLine]) -> list[list[int]]:
        self.tokenised.extend(line.line_number for line in lines)
        return super().prompt_ids_batch(lines)


def lines_of(name: str, count: int) -> list[dict]:
    shots = [" ".join(f"{name}{family}w{word}" for word in range(WORDS)) for family in range(FAMILIES)]
    return [chat_line(f"{name}-{index}", 1 + index % 3, f"{shots[index % FAMILIES]} Item {index}?")
            for index in range(count)]


def runner_for(server: ServerProcess, store: BatchStore, blobs: BlobDir) -> tuple[BatchRunner, CountingTokenizer]:
    model = model_dir("tiny-llama")
    tokenizer = CountingTokenizer(model)
    planner = LinePlanner(CostModel(ModelSpec.from_hf_dir(model), configured_hardware()))
    return BatchRunner(store, blobs, workers=[server.base_url], owner="stream-runner", api_key=API_KEY,
                       max_inflight=32, planner=planner, tokenizer=tokenizer), tokenizer


def test_lines_run_before_the_whole_batch_is_read_and_planned(batch_server: ServerProcess, tmp_path: Path) -> None:
    store, blobs = BatchStore.open("", tmp_path), BlobDir(tmp_path)
    batch_id = add_batch(store, blobs, lines_of("s", 4000))
    runner, _tokenizer = runner_for(batch_server, store, blobs)
    seen: dict[str, object] = {}

    def first_result() -> bool:
        if store.get_batch(batch_id).completed and "plans" not in seen:
            seen["plans"] = list(runner.plan_keeper.plans)
        return store.get_batch(batch_id).status == "completed"

    run_until(runner, first_result, "the batch to complete")
    assert seen["plans"] and all(plan.provisional for plan in seen["plans"]), \
        f"a line was answered before the batch was read and planned whole: {seen['plans']}"
    assert not runner.plan_keeper.plans[-1].provisional
    assert store.get_batch(batch_id).completed == 4000
    store.close()


def test_a_joining_batch_is_planned_with_the_waiting_lines_and_nothing_is_tokenised_twice(
        batch_server: ServerProcess, tmp_path: Path) -> None:
    store, blobs = BatchStore.open("", tmp_path), BlobDir(tmp_path)
    first = add_batch(store, blobs, lines_of("a", 1500))
    runner, tokenizer = runner_for(batch_server, store, blobs)
    joined: list[str] = []

    def second_joins_mid_run() -> bool:
        row = store.get_batch(first)
        if not joined and row.status == "in_progress" and row.completed > 100:
            joined.append(add_batch(store, blobs, lines_of("b", 500)))
            runner.wake()
        return bool(joined) and all(store.get_batch(batch).status == "completed" for batch in (first, *joined))

    run_until(runner, second_joins_mid_run, "both batches to complete")
    assert sorted(tokenizer.tokenised) == sorted([*range(1, 1501), *range(1, 501)])
    last = runner.plan_keeper.plans[-1]
    planned_last = {batch for batch in (first, *joined)
                    if any(line.plan_rank >= last.first_rank for line in store.lines(batch))}
    assert not last.provisional and planned_last == {first, *joined}, "the join planned the waiting lines too"
    assert [store.get_batch(batch).completed for batch in (first, *joined)] == [1500, 500]
    store.close()
