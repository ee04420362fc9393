"""Simulator invariants, on small workloads through the real core policies."""

from __future__ import annotations

import random

import pytest

from bench.workloads.mixer import mix
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.sim.overlap import overlap_function
from sgl_blend.sim.run import SIM_POLICIES, simulate, workload_bound
from sgl_blend.sim.workload import SimRequest

MODEL = model_spec("llama-3.1-8b")
HARDWARE = HardwareSpec.resolve("a100-80g")
COST = CostModel(MODEL, HARDWARE)


def small_mix(n: int = 600, seed: int = 0) -> list[SimRequest]:
    requests = mix(n, 1.1, 0.25, COST, seed)
    return [SimRequest(r.rid, r.prefix_key, r.prefix_len, r.unique_len, min(r.output_len, 2048),
                       min(r.output_len, 2048), r.exact, r.source) for r in requests]


@pytest.mark.parametrize("policy", SIM_POLICIES)
def test_every_request_completes_once_within_kv_capacity(policy: str) -> None:
    requests = small_mix()
    result = simulate(requests, policy, MODEL, HARDWARE, overlap_function("interference"), kv_capacity=60000)
    rids = [r.rid for r in requests]
    assert sorted(result.finished_order) == sorted(rids)
    assert sorted(set(result.admitted_order)) == sorted(rids)
    assert result.peak_kv <= 60000
    assert result.decoded_tokens == sum(r.output_len for r in requests)


def test_sum_overlap_without_sharing_equals_the_cost_model_sum() -> None:
    rng = random.Random(0)
    requests = [SimRequest(f"r{i}", None, 0, rng.randrange(50, 800), out := rng.randrange(200, 2000), out)
                for i in range(300)]
    result = simulate(requests, "fcfs", MODEL, HARDWARE, overlap_function("sum"))
    bound = workload_bound(requests, COST)
    assert result.seconds == pytest.approx(bound["t_comp"] + bound["t_mem"], rel=0.01)


def test_same_seed_same_result() -> None:
    requests = small_mix(300, seed=3)
    first = simulate(requests, "blendserve", MODEL, HARDWARE, overlap_function("max"), kv_capacity=30000)
    second = simulate(requests, "blendserve", MODEL, HARDWARE, overlap_function("max"), kv_capacity=30000)
    assert first.seconds == second.seconds and first.admitted_order == second.admitted_order


def test_retraction_under_memory_pressure_still_completes_everything() -> None:
    requests = [SimRequest(f"r{i}", None, 0, 100, 3000, 3000) for i in range(40)]
    result = simulate(requests, "fcfs", MODEL, HARDWARE, overlap_function("max"), kv_capacity=20000)
    assert sorted(result.finished_order) == sorted(r.rid for r in requests)
    assert result.peak_kv <= 20000
