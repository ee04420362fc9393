"""Every policy, driven through the engine protocol, admits each request exactly once."""

from __future__ import annotations

import random

import pytest

from sgl_blend.core.cost_model import BUILTIN_MODELS, HardwareSpec
from sgl_blend.core.policies import POLICIES, PlannedPolicy, make_policy
from sgl_blend.core.protocol import OfflineRequest


def workload(n: int = 400, seed: int = 0) -> list[OfflineRequest]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(5000) for _ in range(300)] for _ in range(6)]
    requests = []
    for index in range(n):
        group = index % 6
        prompt = prefixes[group][: rng.randrange(50, 300)] + [rng.randrange(5000) for _ in range(20)]
        requests.append(OfflineRequest(f"r{index}", prompt, rng.choice([1, 4, 200, 800]), exact_output_len=index % 3 == 0))
    rng.shuffle(requests)
    return requests


def drive(name: str, requests: list[OfflineRequest], capacity: int = 20000) -> list[str]:
    """A tiny engine: admits proposals that fit, decodes one token per step, preempts now and then."""
    policy = make_policy(name, BUILTIN_MODELS["llama-3.1-8b"], HardwareSpec.resolve("a100-80g"), sample_rate=0.05)
    policy.set_kv_capacity(capacity)
    rng = random.Random(1)
    half = len(requests) // 2
    policy.submit(requests[:half])
    running: dict[str, list[int]] = {}
    decoded: dict[str, int] = {}
    admitted_order: list[str] = []
    finished: set[str] = set()
    lengths = {request.rid: (len(request.prompt_ids), rng.randrange(1, request.max_new_tokens + 1)) for request in requests}
    step = 0
    while len(finished) < len(requests):
        step += 1
        if step == 3:
            policy.submit(requests[half:])
        used = sum(lengths[rid][0] + done[0] for rid, done in running.items())
        proposal = policy.propose(max(capacity - used, 0), 32)
        taken = [request.rid for request in proposal]
        policy.admitted(taken)
        for rid in taken:
            assert rid not in running and rid not in finished
            running[rid] = [decoded.get(rid, 0)]
            admitted_order.append(rid)
        for rid in list(running):
            running[rid][0] += 1
            policy.progress(rid, running[rid][0])
            if running[rid][0] >= lengths[rid][1]:
                policy.finished(rid, running[rid][0])
                finished.add(rid)
                del running[rid]
        if running and step % 17 == 0:
            victim = rng.choice(sorted(running))
            decoded[victim] = running.pop(victim)[0]
            policy.preempted(victim)
        policy.advance(1)
        assert step < 100000
    assert policy.pending_count() == 0
    return admitted_order


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_request_completes_exactly_once(name: str) -> None:
    requests = workload()
    order = drive(name, requests)
    assert set(order) == {request.rid for request in requests}
    assert len(order) > len(requests), "preempted requests are admitted again"


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_withdrawn_requests_are_never_proposed(name: str) -> None:
    policy = make_policy(name, BUILTIN_MODELS["llama-3.1-8b"], HardwareSpec.resolve("a100-80g"))
    requests = workload(50)
    policy.submit(requests)
    policy.withdraw(requests[0].rid)
    proposed: set[str] = set()
    while policy.pending_count():
        batch = [request.rid for request in policy.propose(10**9, 100)]
        policy.admitted(batch)
        for rid in batch:
            policy.finished(rid, 1)
        proposed.update(batch)
        policy.advance(1)
    assert proposed == {request.rid for request in requests[1:]}


def test_unknown_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown offline policy"):
        make_policy("lifo", BUILTIN_MODELS["llama-3.1-8b"], HardwareSpec.resolve("a100-80g"))


@pytest.mark.parametrize("name", ["dfs", "blendserve"])
def test_a_shared_prefix_is_computed_once_not_by_every_request_admitted_with_it(name: str) -> None:
    """SGLang caches a prefix only after the forward that computes it: of a family's requests,
    one goes first, and the rest follow an iteration later, when the prefix is cached; a prefix
    shorter than SGLang's in-batch threshold is not worth the wait."""
    family = [1] * 500
    requests = [OfflineRequest(f"f{index}", family + [100 + index], 4, True) for index in range(6)]
    requests += [OfflineRequest(f"s{index}", [2] * 8 + [200 + index], 4, True) for index in range(3)]
    policy = make_policy(name, BUILTIN_MODELS["llama-3.1-8b"], HardwareSpec.resolve("cpu"))
    policy.set_kv_capacity(10**6)
    policy.submit(requests)
    first = [request.rid for request in policy.propose(10**6, 100)]
    assert sum(rid.startswith("f") for rid in first) == 1
    policy.admitted(first)
    policy.advance(1)
    second = [request.rid for request in policy.propose(10**6, 100)]
    assert sorted(first + second) == sorted(request.rid for request in requests)


def _sharing_pair(output: int) -> list[OfflineRequest]:
    """Two requests sharing a 400-token prefix."""
    shared = list(range(1000, 1400))
    return [OfflineRequest(f"r{index}", shared + [index] * 30, output, exact_output_len=True) for index in range(2)]


def _dfs_policy(batches_in_flight: int, requests: list[OfflineRequest]) -> PlannedPolicy:
    policy = make_policy("dfs", BUILTIN_MODELS["llama-3.1-8b"], HardwareSpec.resolve("h100-sxm"),
                         batches_in_flight=batches_in_flight)
    policy.set_kv_capacity(100_000)
    policy.submit(requests)
    return policy


@pytest.mark.parametrize("batches_in_flight", [1, 2])
def test_a_request_waits_until_the_forward_computing_its_shared_prefix_is_processed(batches_in_flight: int) -> None:
    """DFS admits the first of two requests sharing a prefix and holds the second until the
    first's prefix is in the radix cache: one processed forward later when the engine processes
    each result before scheduling, two under SGLang's overlap scheduler (the second would else be
    admitted while the first's forward runs and compute the prefix again)."""
    policy = _dfs_policy(batches_in_flight, _sharing_pair(output=8))
    assert [request.rid for request in policy.propose(100_000, 8)] == ["r0"]
    policy.admitted(["r0"])
    proposals = []
    for _ in range(batches_in_flight):
        policy.advance(1)
        proposals.append([request.rid for request in policy.propose(100_000, 8)])
    assert proposals == [[]] * (batches_in_flight - 1) + [["r1"]]


def test_a_held_request_is_released_on_an_idle_engine() -> None:
    """Under the overlap scheduler the first request finishes after one processed forward, before
    the count that would release the second: nothing runs, so no forward will come to count, and
    the second (all that is left) must be proposed at once rather than wait forever."""
    policy = _dfs_policy(2, _sharing_pair(output=1))
    assert [request.rid for request in policy.propose(100_000, 8)] == ["r0"]
    policy.admitted(["r0"])
    policy.advance(1)
    policy.finished("r0", 1)
    assert [request.rid for request in policy.propose(100_000, 8)] == ["r1"]


def test_a_request_waits_while_the_prefix_it_shares_is_still_being_prefilled_in_chunks() -> None:
    """A prefix longer than the engine's chunk reaches the radix cache only after its last chunk:
    the engine reports each further chunk (`prefill_continues`), and the request sharing the
    prefix is held until that chunk's forward is processed, not released two forwards after the
    first chunk to compute the rest of the prefix again."""
    policy = _dfs_policy(2, _sharing_pair(output=8))
    assert [request.rid for request in policy.propose(100_000, 8)] == ["r0"]
    policy.admitted(["r0"])
    for _ in range(3):  # three more chunks
        policy.advance(1)
        policy.prefill_continues("r0")
        assert policy.propose(100_000, 8) == []
    policy.advance(1)
    assert policy.propose(100_000, 8) == []
    policy.advance(1)
    assert [request.rid for request in policy.propose(100_000, 8)] == ["r1"]


@pytest.mark.parametrize("further_chunks", [0, 3])
def test_a_request_arriving_after_the_first_of_its_family_was_admitted_waits_for_its_prefix(
        further_chunks: int) -> None:
    """A runner refilling the engine sends a family's lines a few at a time: the first is admitted
    while its prefix is still its own tree node, and the next, arriving a forward later, shares it
    and splits that node (the shared upper part is a new node). The next waits until the first's
    last prefill chunk is processed instead of computing the prefix again: each further chunk of
    the first keeps the upper part in flight too."""
    first, second = _sharing_pair(output=8)
    policy = _dfs_policy(2, [first])
    assert [request.rid for request in policy.propose(100_000, 8)] == ["r0"]
    policy.admitted(["r0"])
    policy.advance(1)
    policy.submit([second])
    for _ in range(further_chunks):
        policy.prefill_continues("r0")
        assert policy.propose(100_000, 8) == []
        policy.advance(1)
    assert policy.propose(100_000, 8) == []
    policy.advance(1)
    assert [request.rid for request in policy.propose(100_000, 8)] == ["r1"]
