"""How a bros-mode server is launched, and the simulator that compares BROS with its baselines."""

from __future__ import annotations

import argparse

import pytest

from sgl_blend.launch.colocation_flags import add_colocation_arguments, colocation_config
from sgl_blend.launch.colocation import colocation_launch
from sgl_blend.core.bros.cost import SwapModel
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.cost_model import BUILTIN_MODELS, HardwareSpec
from sgl_blend.sim.bros_device import RooflineDevice
from sgl_blend.sglang_plugin.settings import PluginSettings
from sgl_blend.sim.bros_engine import BestEffortPool, SimSettings, poisson_arrivals, simulate

# A stand-in latency model in the bros form (5 ms per batch, 20 µs per prefill token, 1 ms per
# decode): the tests that use it check mechanics, not timing.
MODEL = {"form": "bros", "coefficients": {"b_prefill": 5e-3, "a0_prefill": 2e-5, "a1_prefill": 0.0,
                                           "b_decode": 5e-3, "a0_decode": 1e-3, "a1_decode": 0.0}}


def test_bros_mode_disables_the_radix_cache_and_keeps_user_flags() -> None:
    args = colocation_launch(PluginSettings(colocation=ColocationConfig(mode="bros", latency_model=MODEL)),
                             ["--port", "1"])
    assert "--disable-radix-cache" in args and "--radix-cache-backend" not in args and args[:2] == ["--port", "1"]


def test_bros_mode_needs_a_latency_model() -> None:
    parser = argparse.ArgumentParser()
    add_colocation_arguments(parser)
    with pytest.raises(ValueError, match="sgl-blend profile --latency"):
        colocation_config(parser.parse_args(["--colocation", "bros"]))


def test_simulated_bros_serves_rt_ahead_of_be_where_fcfs_queues_them_behind() -> None:
    model = BUILTIN_MODELS["llama-3.1-8b"]
    device = RooflineDevice(model, HardwareSpec("h100", 7.7e14, 2.97e12, 5.5e10),
                            SwapModel(model.kv_bytes_per_token, 5.4e10))
    cost = device.fitted_cost()
    settings = SimSettings(kv_tokens=8192, duration_s=4.0, be_concurrency=16, max_running=64)
    arrivals = poisson_arrivals([(200, 40), (60, 120), (400, 20)], rate=4.0, duration_s=4.0, seed=1)
    fcfs = simulate("fcfs", arrivals, device, cost, settings)
    bros = simulate("bros", arrivals, device, cost, settings)
    assert fcfs["rt_finished"] > 0 and bros["rt_finished"] > 0 and bros["be_finished"] > 0
    assert bros["ttft_attainment"] > fcfs["ttft_attainment"]
    assert bros["normalized_latency_s"] < fcfs["normalized_latency_s"]


class RecordingDevice:
    """A `RooflineDevice` that keeps every batch shape it timed."""

    def __init__(self, device: RooflineDevice) -> None:
        self.device = device
        self.shapes = []

    def iteration_s(self, shape, swap_tokens: int) -> float:
        self.shapes.append(shape)
        return self.device.iteration_s(shape, swap_tokens)


@pytest.mark.parametrize("policy", ["fcfs", "bros"])
def test_every_policy_keeps_the_prefill_token_budget_beyond_its_first_prefill(policy: str) -> None:
    model = BUILTIN_MODELS["llama-3.1-8b"]
    device = RooflineDevice(model, HardwareSpec("h100", 7.7e14, 2.97e12, 5.5e10),
                            SwapModel(model.kv_bytes_per_token, 5.4e10))
    recording = RecordingDevice(device)
    settings = SimSettings(kv_tokens=16384, duration_s=2.0, be_concurrency=16, max_running=64,
                           prefill_token_budget=1024)
    arrivals = poisson_arrivals([(200, 40), (60, 120), (400, 20)], rate=8.0, duration_s=2.0, seed=1)
    simulate(policy, arrivals, recording, device.fitted_cost(), settings)
    # A prompt over the budget runs alone; batches of several prefills stay within it.
    multi = [shape for shape in recording.shapes if shape.prefill_reqs > 1]
    assert multi and all(shape.prefill_tokens <= 1024 for shape in multi)


def test_a_best_effort_pool_runs_each_request_once_and_then_runs_dry() -> None:
    model = BUILTIN_MODELS["llama-3.1-8b"]
    device = RooflineDevice(model, HardwareSpec("h100", 7.7e14, 2.97e12, 5.5e10),
                            SwapModel(model.kv_bytes_per_token, 5.4e10))
    pool = BestEffortPool([(f"job-{i}", 100 + i, 5) for i in range(20)])
    settings = SimSettings(kv_tokens=16384, duration_s=3.0, be_concurrency=8, max_running=64)
    result = simulate("bros", [], device, device.fitted_cost(), settings, be_source=pool)
    assert result["be_finished"] == 20 and pool.next(0.0) is None
