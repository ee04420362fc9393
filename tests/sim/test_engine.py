"""Simulator invariants, on small workloads through the real core policies."""

from __future__ import annotations

import random

import pytest

from sgl_blend.workloads.mixer import mix
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.sim.engine import EngineConfig, SimEngine
from sgl_blend.forward_time.iteration_cost import IterationCost
from sgl_blend.sim.kv_cache import RadixKVCache
from sgl_blend.sim.metrics import workload_bound
from sgl_blend.forward_time.overlap import fit_overlap, overlap_function
from sgl_blend.sim.run import SIM_POLICIES, make_sim_policy, simulate
from sgl_blend.sim.workload import SimRequest, chain_hash

MODEL = model_spec("llama-3.1-8b")
HARDWARE = HardwareSpec.resolve("a100-80g")
COST = CostModel(MODEL, HARDWARE)
INTERFERENCE = overlap_function("interference")  # the two-stream lambda, 0.90


def small_mix(n: int = 500, seed: int = 0) -> list[SimRequest]:
    """A mixed workload with outputs capped so a test runs in a second."""
    return [SimRequest(r.rid, r.source, r.prefix, r.unique_len, min(r.output_len, 1500),
                       min(r.output_len, 1500) if r.exact else r.max_new_tokens, r.exact)
            for r in mix(n, 1.1, 0.25, COST, seed)]


class CheckedEngine(SimEngine):
    """Asserts after every iteration that KV use never exceeds capacity."""

    def run(self, requests, on_finish=None):
        from sgl_blend.sim import engine as engine_module

        original = engine_module._Run._account

        def account(run, *args):
            assert run.kv_used <= run.capacity
            original(run, *args)

        engine_module._Run._account = account
        try:
            return super().run(requests, on_finish)
        finally:
            engine_module._Run._account = original


@pytest.mark.parametrize("policy", SIM_POLICIES)
def test_every_request_completes_once_within_kv_capacity(policy: str) -> None:
    requests = small_mix()
    engine = CheckedEngine(COST, make_sim_policy(policy, MODEL, HARDWARE), INTERFERENCE,
                           EngineConfig(kv_capacity=40000))
    result = engine.run(requests)
    assert sorted(result.finished) == sorted(r.rid for r in requests)
    assert result.peak_kv <= 40000
    assert result.finished == {r.rid: r.output_len for r in requests}
    assert result.prompt_tokens == sum(r.prompt_len for r in requests)
    assert result.output_tokens == sum(r.output_len for r in requests)
    assert sum(result.trace.steps) == result.iterations


@pytest.mark.parametrize("policy", SIM_POLICIES)
def test_admission_order_is_a_permutation(policy: str) -> None:
    requests = small_mix(300, seed=1)
    result = simulate(requests, policy, MODEL, HARDWARE, INTERFERENCE, config=EngineConfig(kv_capacity=30000))
    assert len(result.admitted_order) == len(requests)
    assert sorted(result.admitted_order) == sorted(r.rid for r in requests)


def test_sum_overlap_prices_exactly_the_executed_work_weights_included() -> None:
    """Under ``sum`` the run is its compute side plus its memory side; the memory side is the
    cost model's ``T_mem`` exactly, and the compute side is ``T_comp`` plus what weight-bound
    iterations (a GEMM waiting on its weight read) cost beyond their FLOPs."""
    rng = random.Random(0)
    requests = [SimRequest(f"r{i}", "t", (), rng.randrange(50, 800), out := rng.randrange(200, 2000), out, True)
                for i in range(300)]
    result = simulate(requests, "fcfs", MODEL, HARDWARE, overlap_function("sum"))
    bound = workload_bound(requests, COST, overlap_function("sum"))
    step = IterationCost.of(COST)
    assert result.retractions == 0
    assert result.seconds == pytest.approx(result.comp_seconds + result.mem_seconds, rel=1e-9)
    assert result.mem_seconds == pytest.approx(bound.t_mem, rel=0.01)
    assert bound.t_comp * 0.99 <= result.comp_seconds <= bound.t_comp + result.iterations * step.weight_read


def test_a_small_decode_batch_is_bound_by_reading_the_weights() -> None:
    """Four long decodes: every step reads 16 GB of weights and barely any KV, so a step costs
    the weight read, not four tokens' FLOPs (which the old model charged: ~38x less on an A100)."""
    requests = [SimRequest(f"r{i}", "t", (), 100, 2000, 2000, True) for i in range(4)]
    result = simulate(requests, "fcfs", MODEL, HARDWARE, overlap_function("max"))
    step = IterationCost.of(COST)
    assert step.weight_read > 30 * 4 * step.token_comp
    assert result.seconds == pytest.approx(result.iterations * step.weight_read, rel=0.02)


def test_same_seed_same_result() -> None:
    requests = small_mix(300, seed=3)
    config = EngineConfig(kv_capacity=30000)
    first = simulate(requests, "blendserve", MODEL, HARDWARE, INTERFERENCE, seed=5, config=config)
    second = simulate(requests, "blendserve", MODEL, HARDWARE, INTERFERENCE, seed=5, config=config)
    assert first.seconds == second.seconds
    assert first.admitted_order == second.admitted_order
    assert list(first.trace.comp) == list(second.trace.comp)


def test_retraction_under_memory_pressure_still_completes_everything() -> None:
    # Not ignore_eos: admission reserves only the new-token ratio of the output, so KV overcommits.
    requests = [SimRequest(f"r{i}", "t", (), 100, 3000, 3000, False) for i in range(40)]
    engine = CheckedEngine(COST, make_sim_policy("fcfs", MODEL, HARDWARE), overlap_function("max"),
                           EngineConfig(kv_capacity=20000))
    result = engine.run(requests)
    assert result.retractions > 0
    assert result.finished == {r.rid: 3000 for r in requests}


def test_dfs_keeps_the_sharing_that_random_order_loses_and_no_order_beats_t_o() -> None:
    requests = small_mix(600, seed=2)
    config = EngineConfig(kv_capacity=30000)
    dfs = simulate(requests, "dfs", MODEL, HARDWARE, INTERFERENCE, config=config)
    shuffled = simulate(requests, "fcfs-shuffled", MODEL, HARDWARE, INTERFERENCE, config=config)
    bound = workload_bound(requests, COST, INTERFERENCE)
    assert shuffled.sharing_ratio < dfs.sharing_ratio <= bound.sharing
    assert dfs.seconds >= bound.t_o and shuffled.seconds >= bound.t_o


def test_a_prefix_is_a_hit_only_after_the_forward_that_computed_it() -> None:
    """As in SGLang, whose radix tree takes a prefix in after the forward that computed it: two
    requests admitted in one iteration both compute their common prefix; one admitted later hits."""
    prefix = ((chain_hash("", "few-shot"), 400),)
    together = [SimRequest(f"t{i}", "t", prefix, 10, 5, 5, True) for i in range(2)]
    assert simulate(together, "fcfs", MODEL, HARDWARE, INTERFERENCE).cached_tokens == 0
    cache = RadixKVCache()
    assert cache.acquire(prefix) == 0 and cache.cached_prefix(prefix) == 0
    assert cache.acquire(prefix) == 0, "the same iteration: not computed yet"
    cache.advance(1)
    assert cache.cached_prefix(prefix) == 400 and cache.acquire(prefix) == 400


def test_radix_cache_evicts_unreferenced_segments_children_first() -> None:
    cache = RadixKVCache(page_size=16)
    parent = (chain_hash("", "sys"), 20)
    child = (chain_hash(parent[0], "shot"), 40)
    assert cache.acquire((parent, child)) == 0
    assert cache.used == 32 + 48
    cache.advance(1)
    assert cache.acquire((parent, child)) == 60
    cache.release((parent, child))
    assert cache.evictable == 0
    cache.release((parent, child))
    assert cache.evictable == 80
    assert cache.evict(1) == 48
    assert cache.cached_prefix((parent, child)) == 20
    assert cache.acquire((parent,)) == 20
    assert cache.evict(100) == 0


def test_fitted_overlap_recovers_its_coefficients() -> None:
    rng = random.Random(0)
    samples = []
    for _ in range(50):
        comp, mem = rng.random(), rng.random()
        samples.append((comp, mem, 1.0 * max(comp, mem) + 0.3 * min(comp, mem) + 0.01))
    assert fit_overlap(samples) == pytest.approx((1.0, 0.3, 0.01), abs=1e-9)


def test_a_new_request_needs_its_whole_clipped_decode_room_free() -> None:
    """SGLang admits a request only if its prompt plus ``min(max_new_tokens, 4096)`` fits beside
    what running requests reserve; the new-token ratio discounts only the running ones."""
    first = SimRequest("first", "t", (), 100, 3000, 3000, False)
    second = SimRequest("second", "t", (), 100, 100, 3500, False)
    policy = make_sim_policy("fcfs", MODEL, HARDWARE)
    iterations = [0]
    started: dict[str, int] = {}
    admitted, advance = policy.admitted, policy.advance

    def record(rids) -> None:
        rids = list(rids)
        for rid in rids:
            started.setdefault(rid, iterations[0])
        admitted(rids)

    def count(steps: int) -> None:
        iterations[0] += steps
        advance(steps)

    policy.admitted, policy.advance = record, count
    SimEngine(COST, policy, overlap_function("max"), EngineConfig(kv_capacity=5000)).run([first, second])
    # At 0.7 x 3000 reserved for the first, 100 + 3500 does not fit until the ratio has decayed.
    assert started["first"] == 0
    assert 200 < started["second"] < 3000


def prefix_families(families: int = 30, per_family: int = 8) -> list[SimRequest]:
    """``families`` 400-token shared prefixes, ``per_family`` short requests each, shuffled."""
    requests = [SimRequest(f"f{family}-{j}", "t", ((chain_hash("", f"family{family}"), 400),), 50, 300, 300, True)
                for family in range(families) for j in range(per_family)]
    random.Random(0).shuffle(requests)
    return requests


def test_a_scattered_order_loses_sharing_to_eviction_when_kv_is_small() -> None:
    """Finished tails stay cached (as in SGLang's radix tree) and push a family's prefix out of
    the LRU before a scattered order comes back to it; DFS keeps each family resident (it loses
    only what members admitted together recompute). With KV to spare nothing is evicted."""
    requests = prefix_families()
    best = workload_bound(requests, COST, INTERFERENCE).sharing
    small, large = EngineConfig(kv_capacity=8000), EngineConfig(kv_capacity=200_000)
    dfs = simulate(requests, "dfs", MODEL, HARDWARE, INTERFERENCE, config=small)
    scattered = simulate(requests, "fcfs-shuffled", MODEL, HARDWARE, INTERFERENCE, config=small)
    roomy = simulate(requests, "fcfs-shuffled", MODEL, HARDWARE, INTERFERENCE, config=large)
    assert scattered.sharing_ratio < 0.6 * dfs.sharing_ratio
    assert roomy.sharing_ratio == pytest.approx(best, rel=0.05)


def test_a_finished_tail_is_cached_evictable_and_goes_before_its_prefix() -> None:
    cache = RadixKVCache()
    prefix = ((chain_hash("", "sys"), 100),)
    cache.acquire(prefix)
    cache.advance(1)
    assert cache.retain("tail/r0", 30) == 30
    cache.release(prefix)
    assert (cache.used, cache.evictable) == (130, 130)
    assert cache.evict(1) == 30
    assert cache.cached_prefix(prefix) == 100
    assert cache.evict(1) == 100 and cache.used == 0


def test_one_run_priced_under_two_lambdas_matches_two_runs() -> None:
    requests = small_mix(200, seed=4)
    config = EngineConfig(kv_capacity=30000)
    nanoflow = overlap_function("interference", 0.24)
    both = simulate(requests, "blendserve", MODEL, HARDWARE, INTERFERENCE, config=config, also_price=(nanoflow,))
    alone = simulate(requests, "blendserve", MODEL, HARDWARE, nanoflow, config=config)
    assert both.seconds_under[nanoflow.name] == pytest.approx(alone.seconds, rel=1e-9)
    assert both.seconds_under[INTERFERENCE.name] == both.seconds
    assert nanoflow.name.startswith("nanoflow-bound") and INTERFERENCE.name.startswith("two-stream")


def test_default_overlap_takes_lambda_from_the_hardware_profile() -> None:
    from dataclasses import replace

    from sgl_blend.forward_time.overlap import hardware_overlap

    assert hardware_overlap(HARDWARE).weight_min == HARDWARE.corun_interference == 0.90
    assert hardware_overlap(replace(HARDWARE, corun_interference=0.5)).weight_min == 0.5
    assert hardware_overlap(HARDWARE, interference=0.24).weight_min == 0.24


@pytest.mark.parametrize("chunk", [128, 2048])
def test_the_prefill_room_is_the_shared_rule_for_every_policy(chunk: int) -> None:
    """No iteration carries more prefill than `prefill_room` allows: chunk less decodes."""
    from sgl_blend.sim import engine as engine_module

    requests = small_mix(150, seed=6)
    seen: list[tuple[int, int]] = []
    original = engine_module._Run._prefill_room

    def room(run, n_decode):
        value = original(run, n_decode)
        assert value <= max(chunk - n_decode, 0)
        seen.append((n_decode, value))
        return value

    engine_module._Run._prefill_room = room
    try:
        for policy in ("dfs", "dfs+pacing", "blendserve"):
            simulate(requests, policy, MODEL, HARDWARE, INTERFERENCE, config=EngineConfig(kv_capacity=30000,
                                                                                          token_budget=chunk))
    finally:
        engine_module._Run._prefill_room = original
    assert seen


def test_a_prefill_produces_the_first_token_as_sglang_does() -> None:
    """A request of one output token finishes with its prefill; one of d tokens decodes d - 1
    times, each decode reading its context including the token fed in."""
    one = SimRequest("one", "t", (), 100, 1, 1, True)
    result = simulate([one], "fcfs", MODEL, HARDWARE, overlap_function("sum"))
    assert result.iterations == 1 and result.mem_seconds == 0.0
    five = SimRequest("five", "t", (), 100, 5, 5, True)
    result = simulate([five], "fcfs", MODEL, HARDWARE, overlap_function("sum"))
    step = IterationCost.of(COST)
    assert result.iterations == 5
    assert result.mem_seconds == pytest.approx(step.memory_side(sum(100 + k for k in range(1, 5))))


def test_requests_from_prompts_share_exactly_what_the_prompts_share() -> None:
    """Segments come from the prompts' prefix tree: the simulated cache saves what a radix cache
    over the real token ids saves."""
    from sgl_blend.core.prefix_tree import PrefixTree
    from sgl_blend.sim.metrics import max_sharing_ratio
    from sgl_blend.sim.workload import requests_from_prompts

    rng = random.Random(0)
    stems = [[rng.randrange(1000) for _ in range(rng.randrange(5, 60))] for _ in range(6)]
    prompts = [rng.choice(stems) + [rng.randrange(1000) for _ in range(rng.randrange(0, 30))] for _ in range(80)]
    prompts += [list(prompts[3]), prompts[5][:4]]  # an identical prompt, a prompt inside another
    requests = requests_from_prompts([f"r{i}" for i in range(len(prompts))], prompts, [(3, 3, True)] * len(prompts))
    assert [request.prompt_len for request in requests] == [len(prompt) for prompt in prompts]
    tree = PrefixTree()
    for index, prompt in enumerate(prompts):
        tree.insert(index, prompt, 0.0, 0.0)
    assert max_sharing_ratio(requests) == pytest.approx(tree.sharing_ratio())
    rebuilt = PrefixTree()
    for index, request in enumerate(requests):
        rebuilt.insert(index, request.prompt_ids(), 0.0, 0.0)
    assert rebuilt.root.saved == tree.root.saved


def test_a_stock_engine_has_the_limits_the_emulated_server_gets() -> None:
    from sgl_blend.emulation.devices import resolve_device
    from sgl_blend.emulation.memory import engine_sizing
    from sgl_blend.models.llama31 import EMULATION_MODELS
    from sgl_blend.sim.sizing import stock_engine

    stock = stock_engine("llama-3.1-8b", "h100")
    sizing = engine_sizing(EMULATION_MODELS["llama-3.1-8b"], resolve_device("h100").memory)
    assert (stock.config.kv_capacity, stock.config.token_budget, stock.config.max_running) == (
        sizing.max_total_tokens, sizing.chunked_prefill_size, sizing.max_running_requests)
    assert stock.hardware == resolve_device("h100").hardware
    assert stock_engine("llama-3.1-8b", "h100", chunk=512).config.token_budget == 512
