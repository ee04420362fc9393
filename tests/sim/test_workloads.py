"""Workload generators, the mixer and the JSONL round trip."""

from __future__ import annotations

import pytest

from sgl_blend.workloads import io
from sgl_blend.workloads.mixer import mix
from sgl_blend.workloads.synthetic import TRACES, generate
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.sim.metrics import workload_bound
from sgl_blend.forward_time.overlap import overlap_function

COST = CostModel(model_spec("llama-3.1-8b"), HardwareSpec.resolve("a100-80g"))
MAX = overlap_function("max")


@pytest.mark.parametrize("trace", TRACES)
def test_generators_are_deterministic_for_a_seed(trace: str) -> None:
    assert generate(trace, 50, seed=4) == generate(trace, 50, seed=4)
    assert generate(trace, 50, seed=4) != generate(trace, 50, seed=5)


# OpenVid is capped at 0.09, not Table 4's 0.05: see the synthetic module for why its tail is cut.
@pytest.mark.parametrize("trace, density, sharing", [("burstgpt", 17.78, 0.02), ("azure", 33.2, 0.01),
                                                     ("openvid", 0.09, 0.0), ("mmlu", 54.91, 0.86)])
def test_traces_match_table_4(trace: str, density: float, sharing: float) -> None:
    bound = workload_bound(generate(trace, 4000, seed=0), COST, MAX)
    assert bound.density == pytest.approx(density, rel=0.15)
    assert bound.sharing == pytest.approx(sharing, abs=0.015)


@pytest.mark.parametrize("density, sharing", [(1.4, 0.35), (0.9, 0.05), (1.2, 0.25)])
def test_mixer_hits_its_targets(density: float, sharing: float) -> None:
    bound = workload_bound(mix(8000, density, sharing, COST, seed=1), COST, MAX)
    assert bound.density == pytest.approx(density, rel=0.05)
    assert bound.sharing == pytest.approx(sharing, abs=0.01)


def test_jsonl_round_trip_regenerates_the_workload(tmp_path) -> None:
    requests = mix(500, 1.0, 0.3, COST, seed=2)
    path = io.save_jsonl(requests, tmp_path / "w.jsonl", {"density": 1.0, "sharing": 0.3, "seed": 2})
    loaded, meta = io.load_jsonl(path)
    assert loaded == requests
    assert meta["seed"] == 2
    assert mix(500, 1.0, 0.3, COST, seed=2) == requests
    assert [r.prompt_ids() for r in loaded[:20]] == [r.prompt_ids() for r in requests[:20]]
