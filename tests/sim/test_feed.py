"""The simulator's feed is the batch runner's: planned lines in plan order with placements through
a window, output-length samples first, a re-plan once they are back; other orders in file order."""

from __future__ import annotations

import random

from sgl_blend.batch_lines.plan import LinePlanner
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.placement import COMPUTE, MEMORY, SAMPLE
from sgl_blend.sim.engine import EngineConfig
from sgl_blend.server.window import WINDOW_MULTIPLE
from sgl_blend.sim.feed import RunnerFeed, runner_window
from sgl_blend.sim.workload import SimRequest, chain_hash

MODEL = model_spec("llama-3.1-8b")
COST = CostModel(MODEL, HardwareSpec.resolve("a100-80g"))


def families(n: int = 300, exact: bool = True, seed: int = 0) -> list[SimRequest]:
    """Few-shot families with short outputs, and unique prompts with long ones, shuffled."""
    rng = random.Random(seed)
    requests = []
    for index in range(n):
        if index % 3:
            family = ((chain_hash("", f"family{index % 7}"), 300),)
            requests.append(SimRequest(f"f{index}", "t", family, 20, 4, 4 if exact else 64, exact))
        else:
            output = rng.randrange(500, 3000)
            requests.append(SimRequest(f"u{index}", "t", (), rng.randrange(50, 400), output,
                                       output if exact else 4096, exact))
    rng.shuffle(requests)
    return requests


def drain(feed: RunnerFeed, requests: list[SimRequest], finish_order=None) -> list:
    """Finish lines as they are sent (oldest first, or as ``finish_order`` picks); returns every
    request sent, in sending order, checking the window on the way."""
    sent = list(feed.start())
    outstanding = [request.rid for request in sent]
    by_rid = {request.rid: request for request in requests}
    while outstanding:
        assert len(outstanding) <= feed.window
        rid = outstanding.pop(finish_order(outstanding) if finish_order else 0)
        more = list(feed.finished(rid, by_rid[rid].output_len))
        sent += more
        outstanding += [request.rid for request in more]
    return sent


def test_planned_lines_go_in_plan_order_with_placements_through_the_window() -> None:
    requests = families()
    feed = RunnerFeed(requests, LinePlanner.for_policy("blendserve", COST), window=16)
    sent = drain(feed, requests)
    assert sorted(request.rid for request in sent) == sorted(request.rid for request in requests)
    sides = [request.placement.side for request in sent]
    assert SAMPLE not in sides, "exact lengths need no samples"
    compute = [request.placement.position for request in sent if request.placement.side == COMPUTE]
    memory = [request.placement.position for request in sent if request.placement.side == MEMORY]
    assert compute and memory
    assert compute == sorted(compute) and memory == sorted(memory, reverse=True)
    assert COMPUTE in sides[:16] and MEMORY in sides[:16], "both ends from the start"


def test_samples_go_first_and_the_rest_is_planned_again_when_they_are_back() -> None:
    requests = families(600, exact=False)
    feed = RunnerFeed(requests, LinePlanner.for_policy("blendserve", COST), window=8, seed=3)
    samples = set(feed.samples)
    assert samples, "a blended plan samples lines whose length is not fixed"
    sent = drain(feed, requests)
    assert {request.rid for request in sent[:len(samples)]} == {requests[index].rid for index in samples}
    assert all(request.placement.side == SAMPLE for request in sent[:len(samples)])
    assert feed.plans == 2
    compute = [request.placement.position for request in sent if request.placement.side == COMPUTE]
    memory = [request.placement.position for request in sent if request.placement.side == MEMORY]
    assert compute == sorted(compute) and memory == sorted(memory, reverse=True), \
        "the second plan's positions follow the first's on both sides"


def test_unplanned_orders_go_in_file_order_without_placements() -> None:
    requests = families(100)
    feed = RunnerFeed(requests, LinePlanner.for_policy("lpm", COST), window=5)
    sent = drain(feed, requests, finish_order=lambda outstanding: len(outstanding) - 1)
    assert [request.rid for request in sent] == [request.rid for request in requests]
    assert all(request.placement is None for request in sent)


def test_the_window_is_twice_what_the_engine_runs_at_once() -> None:
    requests = [SimRequest(f"r{i}", "t", (), 900, 200, 200, True) for i in range(10)]
    assert runner_window(requests, EngineConfig(max_running=2048), kv_capacity=100_000) == WINDOW_MULTIPLE * 100
    assert runner_window(requests, EngineConfig(max_running=64), kv_capacity=100_000) == WINDOW_MULTIPLE * 64
