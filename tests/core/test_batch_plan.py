"""The global batch plan, placed requests in the policies, and the policy-call record's replay."""

from __future__ import annotations

import random

from sgl_blend.core.batch_plan import plan_batch
from sgl_blend.core.cost_model import BUILTIN_MODELS, CostModel, HardwareSpec
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.placement import COMPUTE, MEMORY, SAMPLE, Placement
from sgl_blend.core.policies import make_policy
from sgl_blend.core.policy_log import RecordedPolicy, replay
from sgl_blend.core.prefix_tree import PrefixTree
from sgl_blend.core.protocol import OfflineRequest
from sgl_blend.offline import offline_routing_key, placement_of

MODEL = BUILTIN_MODELS["llama-3.1-8b"]
GPU = HardwareSpec.resolve("a100-80g")
CPU = HardwareSpec.resolve("cpu")


def evaluation_items(n: int = 600, seed: int = 0) -> list[WorkItem]:
    """Few-shot families (long shared prefixes, outputs short or long by family), unique prompts."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(30000) for _ in range(400)] for _ in range(12)]
    items = []
    for key in range(n):
        if key % 4 == 0:
            items.append(WorkItem(key, [rng.randrange(30000) for _ in range(rng.randrange(20, 200))], 4000, False))
        else:
            family = key % 12
            items.append(WorkItem(key, prefixes[family] + [rng.randrange(30000) for _ in range(15)],
                                  (2, 900)[family % 2], True))
    rng.shuffle(items)
    return items


def test_blended_plan_feeds_samples_first_then_both_ends_in_order() -> None:
    plan = plan_batch(evaluation_items(), CostModel(MODEL, GPU), blend=True, sample_rate=0.05)
    sides = [plan.placements[key].side for key in plan.feed]
    assert plan.samples and sides[:len(plan.samples)] == [SAMPLE] * len(plan.samples)
    assert SAMPLE not in sides[len(plan.samples):]
    compute = [plan.placements[key].position for key in plan.feed if plan.placements[key].side == COMPUTE]
    memory = [plan.placements[key].position for key in plan.feed if plan.placements[key].side == MEMORY]
    assert compute and memory
    assert compute == sorted(compute) and memory == sorted(memory, reverse=True)
    assert max(compute) < min(memory), "the compute side is the left of the order"
    first_half = sides[len(plan.samples):len(plan.samples) + 60]
    assert COMPUTE in first_half and MEMORY in first_half, "both ends are fed from the start"
    for side, later in ((COMPUTE, lambda a, b: b > a), (MEMORY, lambda a, b: b < a)):
        positions = [plan.placements[key].position for key in plan.feed if plan.placements[key].side == side]
        for key in plan.feed:
            placement = plan.placements[key]
            if placement.side == side:
                assert placement.after == sum(later(placement.position, other) for other in positions), \
                    "each request knows how many of its side the plan scans after it"
    assert all(plan.placements[key].after is None for key in plan.samples)


def test_unblended_plan_is_one_cursor_dfs_without_samples() -> None:
    items = evaluation_items()
    plan = plan_batch(items, CostModel(MODEL, CPU), blend=False)
    assert not plan.samples and not plan.blended
    tree = PrefixTree()
    for index, item in enumerate(items):
        tree.insert(index, item.prompt_ids, 1.0, 1.0)
    assert plan.feed == [items[index].key for index in tree.dfs_order()]
    assert [plan.placements[key].position for key in plan.feed] == list(range(len(items)))


def test_observed_samples_set_their_families_estimates() -> None:
    items = evaluation_items()
    cost = CostModel(MODEL, GPU)
    first = plan_batch(items, cost, blend=True, sample_rate=0.05)
    by_key = {item.key: item for item in items}
    observed = {key: (by_key[key], 77) for key in first.samples}
    rest = [item for item in items if item.key not in set(first.samples)]
    second = plan_batch(rest, cost, blend=True, observed=observed)
    assert not second.samples and len(second.feed) == len(rest)
    unique = [item for item in rest if not item.exact_output_len]
    assert {second.placements[item.key].output for item in unique} == {77}


def placed_requests(plan, items: list[WorkItem]) -> list[OfflineRequest]:
    return [OfflineRequest(f"r{item.key}", item.prompt_ids, item.max_new_tokens, item.exact_output_len,
                           plan.placements[item.key]) for item in items]


def test_policy_admits_placed_requests_by_their_placement_whatever_the_arrival_order() -> None:
    items = [item for item in evaluation_items() if item.exact_output_len]
    plan = plan_batch(items, CostModel(MODEL, GPU), blend=True)
    requests = placed_requests(plan, items)
    random.Random(3).shuffle(requests)
    policy = make_policy("blendserve", MODEL, GPU, paced=False)
    policy.set_kv_capacity(40_000)
    policy.submit(requests)
    placement = {request.rid: request.placement for request in requests}
    admitted: list[str] = []
    while policy.pending_count():
        batch = [request.rid for request in policy.propose(40_000, 8)]
        policy.admitted(batch)
        for rid in batch:
            policy.finished(rid, 1)
        admitted += batch
        policy.advance(1)
    compute = [placement[rid].position for rid in admitted if placement[rid].side == COMPUTE]
    memory = [placement[rid].position for rid in admitted if placement[rid].side == MEMORY]
    assert compute == sorted(compute) and memory == sorted(memory, reverse=True)
    assert len(compute) + len(memory) == len(items)


def test_blendserve_on_a_device_without_overlap_is_dfs_unpaced() -> None:
    assert not CPU.blending_pays and GPU.blending_pays
    policy = make_policy("blendserve", MODEL, CPU)
    assert not policy.paces_prefill and policy.sample_rate == 0.0
    requests = [OfflineRequest(f"r{item.key}", item.prompt_ids, item.max_new_tokens, item.exact_output_len)
                for item in evaluation_items(200)]
    dfs = make_policy("dfs", MODEL, CPU)
    orders = []
    for candidate in (policy, dfs):
        candidate.set_kv_capacity(10**9)
        candidate.submit(requests)
        orders.append([request.rid for request in candidate.propose(10**9, 1000)])
    assert orders[0] == orders[1]


def drive_recorded(policy, requests: list[OfflineRequest]) -> None:
    rng = random.Random(5)
    policy.set_kv_capacity(30_000)
    policy.submit(requests[:150])
    running: dict[str, int] = {}
    for step in range(4000):
        if step == 10:
            policy.submit(requests[150:])
        policy.prefill_token_budget()
        batch = [request.rid for request in policy.propose(30_000 - 400 * len(running), 16)]
        taken = batch[:rng.randrange(len(batch) + 1)]  # an engine admits a prefix of the proposal
        policy.admitted(taken)
        running.update((rid, 0) for rid in taken)
        for rid in list(running):
            running[rid] += 1
            if running[rid] >= 3 + hash(rid) % 40:
                policy.finished(rid, running.pop(rid))
        policy.advance(1)


def test_a_recorded_run_replays_to_the_same_decisions_and_another_policy_does_not() -> None:
    items = evaluation_items(300)
    requests = [OfflineRequest(f"r{item.key}", item.prompt_ids, item.max_new_tokens, item.exact_output_len)
                for item in items]
    recorded = RecordedPolicy(make_policy("blendserve", MODEL, GPU))
    drive_recorded(recorded, requests)
    assert any(event[0] == "propose" and event[3] for event in recorded.events)
    assert replay(recorded.events, make_policy("blendserve", MODEL, GPU)) == []
    assert replay(recorded.events, make_policy("fcfs", MODEL, GPU)) != []


def test_placement_travels_in_the_routing_key() -> None:
    placement = Placement(MEMORY, 4711, 0.8312, 900, 52)
    key = offline_routing_key("batch_abc", placement)
    assert placement_of(key) == Placement(MEMORY, 4711, 0.8312, 900, 52)
    assert placement_of(offline_routing_key("batch_abc", Placement(SAMPLE, 3, 1.0, 128))) == Placement(SAMPLE, 3, 1.0, 128)
    assert placement_of("sgl-blend-offline:job@m4711:0.8312:900") == Placement(MEMORY, 4711, 0.8312, 900), \
        "a key written before placements counted what follows them still reads"
    assert placement_of(offline_routing_key("batch_abc")) is None
    assert placement_of("sgl-blend-offline:job@junk") is None
    assert placement_of("someone-else@c1:1:1") is None


def test_a_window_of_a_plan_knows_how_much_of_each_side_is_still_to_come() -> None:
    items = [item for item in evaluation_items() if item.exact_output_len]
    plan = plan_batch(items, CostModel(MODEL, GPU), blend=True)
    window = [plan.feed[index] for index in range(40)]
    by_key = {item.key: item for item in items}
    policy = make_policy("blendserve", MODEL, GPU)
    policy.set_kv_capacity(40_000)
    policy.submit(placed_requests(plan, [by_key[key] for key in window]))
    policy.propose(40_000, 1)
    sides = {side: [key for key in plan.feed if plan.placements[key].side == side] for side in (COMPUTE, MEMORY)}
    here = {side: [key for key in window if plan.placements[key].side == side] for side in (COMPUTE, MEMORY)}
    assert policy.scanner.beyond == {side: len(sides[side]) - len(here[side]) for side in (COMPUTE, MEMORY)}
