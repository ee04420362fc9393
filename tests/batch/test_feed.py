"""The feed's queues and the planner that orders them, without an engine: lines leave in the order
given, samples and unanswered lines go first, a new plan reorders only what is still unsent, plans
share one rank space, and a plan is made while a batch is still being read only when it is due."""

from __future__ import annotations

import asyncio
from array import array
from pathlib import Path

from sgl_blend.batch_lines.plan import MEMORY_TOP, LinePlanner, RankSpace
from sgl_blend.core.batch_plan import BatchPlan
from sgl_blend.core.cost_model import BUILTIN_HARDWARE, CostModel, model_spec
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.placement import COMPUTE, MEMORY, Placement
from sgl_blend.server.assignment import Slot
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.feed import Feed
from sgl_blend.server.planning import FIRST_PROVISIONAL_LINES, PlanKeeper
from sgl_blend.server.store import BatchStore, LineRow
from tests.batch.helpers import add_batch, chat_line

A, B = Slot("http://a"), Slot("http://b")


def test_lines_leave_each_slot_in_order_with_samples_and_retries_first() -> None:
    feed = Feed()
    keys = [("x", number) for number in range(1, 6)]
    feed.append(keys, {key: A if key[1] % 2 else B for key in keys})
    feed.push_front([("x", 9)], {("x", 9): A}, {("x", 9): Placement("sample", 0, 1.0, 8)})
    assert [feed.pop(A) for _ in range(4)] == [("x", 9), ("x", 1), ("x", 3), ("x", 5)]
    assert feed.pop(A) is None and feed.take_placement(("x", 9)).side == "sample"
    feed.push_front([("x", 3)], {("x", 3): B})
    assert [feed.pop(B) for _ in range(3)] == [("x", 3), ("x", 2), ("x", 4)]


def test_a_new_plan_reorders_only_what_it_covers_and_slots_move_in_order() -> None:
    feed = Feed()
    feed.append([("x", 1), ("x", 2), ("y", 1)], {("x", 1): A, ("x", 2): A, ("y", 1): A})
    placements = {key: Placement(COMPUTE, rank, 1.0, 4) for rank, key in enumerate([("x", 2), ("x", 3), ("x", 1)])}
    feed.replace([("x", 2), ("x", 3), ("x", 1)], {("x", 3): A, ("x", 2): A, ("x", 1): A}, placements)
    assert list(feed.queued()) == [("y", 1), ("x", 2), ("x", 3), ("x", 1)]
    feed.move_slots({A}, {key: B for key in feed.queued()})
    assert feed.pop(A) is None and feed.pop(B) == ("y", 1)
    feed.remove_batch("x")
    assert len(feed) == 0 and not any(key[0] == "x" for key in feed.queued())


def test_every_plan_follows_the_earlier_ones_in_one_rank_space() -> None:
    ranks = RankSpace()

    def plan(compute: int, memory: int) -> BatchPlan:
        placements = {("c", i): Placement(COMPUTE, i, 2.0, 4) for i in range(compute)}
        placements.update({("m", i): Placement(MEMORY, compute + i, 0.5, 400) for i in range(memory)})
        return BatchPlan(list(placements), placements)

    first = ranks.place(plan(3, 2))
    sample = ranks.take_compute()
    second = ranks.place(plan(2, 2))
    assert [first[("c", i)].position for i in range(3)] == [0, 1, 2] and sample == 3
    assert [second[("c", i)].position for i in range(2)] == [4, 5]
    # memory sides are scanned from their highest position: the first plan's come first
    assert (first[("m", 1)].position, first[("m", 0)].position) == (MEMORY_TOP, MEMORY_TOP - 1)
    assert max(second[("m", i)].position for i in range(2)) < first[("m", 0)].position


def item(number: int) -> WorkItem:
    return WorkItem(number, array("i", [7, 7, 7, number]), 4, True)


def keeper_over(tmp_path: Path, lines: int) -> tuple[BatchStore, str, Feed, PlanKeeper]:
    """A keeper with a store holding one batch of ``lines`` lines, planning without blending."""
    store, blobs = BatchStore.open("", tmp_path), BlobDir(tmp_path)
    batch_id = add_batch(store, blobs, [chat_line("c")], owner="planner-test")
    store.add_lines(batch_id, "planner-test", [LineRow(number, f"c{number}", 0, 0) for number in range(1, lines + 1)])
    feed = Feed()
    cost = CostModel(model_spec("llama-3.1-8b"), BUILTIN_HARDWARE["h100-sxm"])
    keeper = PlanKeeper(feed, LinePlanner(cost, blend=False), store, "planner-test",
                         lambda keys, _items: dict.fromkeys(keys, A), wake=lambda: None)
    return store, batch_id, feed, keeper


def test_while_batches_are_read_a_plan_waits_for_enough_lines_unless_the_queue_runs_dry(tmp_path: Path) -> None:
    store, batch_id, feed, keeper = keeper_over(tmp_path, 12)

    async def drive() -> None:
        keeper.add(batch_id, list(range(1, 11)), {number: item(number) for number in range(1, 11)})
        keeper.step(validating=True, starving=False)
        assert not keeper.planning, "ten lines of a batch still being read wait for more"
        keeper.step(validating=True, starving=True)
        await keeper._task
        assert [record.provisional for record in keeper.plans] == [True] and len(feed) == 10
        keeper.add(batch_id, [11, 12], {11: item(11), 12: item(12)})
        keeper.step(validating=False, starving=False)
        await keeper._task
        assert [record.lines for record in keeper.plans] == [10, 12] and not keeper.plans[-1].provisional

    asyncio.run(drive())
    ranks = [line.plan_rank for line in store.lines(batch_id)]
    assert FIRST_PROVISIONAL_LINES > 12 and min(ranks) >= 10, "the last plan's ranks follow the first's"
    store.close()


def test_a_provisional_plan_that_took_every_line_is_followed_by_a_validated_one(tmp_path: Path) -> None:
    """Validation can end between a plan's start and its end: the plan stays provisional though it
    took every line, and the lines still queued are planned again once validation is over."""
    store, batch_id, _feed, keeper = keeper_over(tmp_path, 10)

    async def drive() -> None:
        keeper.add(batch_id, list(range(1, 11)), {number: item(number) for number in range(1, 11)})
        keeper.step(validating=True, starving=True)
        await keeper._task
        assert [record.provisional for record in keeper.plans] == [True] and not keeper.unplanned
        keeper.step(validating=False, starving=False)
        await keeper._task
        assert [(record.lines, record.provisional) for record in keeper.plans] == [(10, True), (10, False)]
        keeper.step(validating=False, starving=False)
        assert not keeper.planning, "one validated plan is enough"

    asyncio.run(drive())
    store.close()
