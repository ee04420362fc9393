"""The per-iteration co-location decision, on plain views (no engine): online first, offline
decodes parked beyond the budget, offline prefill chunks within what is left, Echo's deadline
budget and online reserve, and HyGen's utility order against starvation."""

from __future__ import annotations

import json
import random

import pytest

from sgl_blend.core.colocation import (
    ColocationConfig, ColocationController, IterationView, OnlineDemandWindow, RunningRequest, WaitingOnline,
    deadline_budget,
)
from sgl_blend.core.latency_model import LinearLatencyModel
from sgl_blend.core.state_budget import NEAR_ZERO_FRACTION
from sgl_blend.core.psm_policy import utility_order
from sgl_blend.sglang_plugin.modes.colocation import ColocationMode

# 1 ms per iteration, 10 µs per prefill token, 1 µs per decode context token.
MODEL = LinearLatencyModel("hygen", (1e-3, 1e-5, 1e-6, 0.0, 0.0, 0.0, 0.0))


def controller(**settings) -> ColocationController:
    settings.setdefault("mode", "hygen")
    return ColocationController(ColocationConfig(latency_model=MODEL.to_dict(), **settings))


def offline(rid: str, context: int) -> RunningRequest:
    return RunningRequest(rid, online=False, context=context, reserved=10)


def test_offline_decodes_beyond_the_budget_are_parked_newest_last() -> None:
    plan = controller(latency_budget_s=0.0045).begin(IterationView(
        now=0.0, running=[RunningRequest("on", True, 1000), offline("a", 1000), offline("b", 1000),
                          offline("c", 1000)], waiting_online=[], kv_capacity=100_000))
    # 1 ms + 1 ms online + 1 ms per offline decode: two offline decodes fit in 4.5 ms.
    assert plan.park == ["c"]
    assert plan.budget.predicted_s() == pytest.approx(0.004)


def test_online_work_is_charged_even_beyond_the_budget_and_offline_gets_nothing() -> None:
    plan = controller(latency_budget_s=0.002).begin(IterationView(
        now=0.0, running=[RunningRequest("on", True, 500), offline("a", 100)],
        waiting_online=[WaitingOnline("new", 400, 16, 0.0)], kv_capacity=100_000))
    assert plan.park == ["a"]
    assert plan.budget.predicted_s() == pytest.approx(1e-3 + 500e-6 + 400e-5)
    assert plan.budget.offline_chunk(extend=100, prefix=0, max_new_tokens=8) == 0


def test_offline_chunk_fills_the_residual_budget_and_respects_the_decode_iteration() -> None:
    budget = controller(latency_budget_s=0.003, min_offline_chunk=8).begin(
        IterationView(now=0.0, running=[], waiting_online=[], kv_capacity=100_000, chunk_tokens=4096)).budget
    chunk = budget.offline_chunk(extend=1000, prefix=0, max_new_tokens=8)
    assert chunk == 200  # (3 ms - 1 ms) / 10 µs per token
    budget.commit_offline_prefill(chunk, 0, finishes_prompt=False, max_new_tokens=8)
    assert budget.offline_chunk(extend=800, prefix=200, max_new_tokens=8) == 0
    assert budget.offline_chunk(extend=800, prefix=200, max_new_tokens=8, must_progress=True) == 8
    # A whole prompt whose decode iteration would exceed the budget is not admitted: 1 ms + 0.5 ms
    # online + 0.1 ms of prefill fits 2.5 ms, the decode after it (1 ms + 501 µs + 1,210 µs) does not.
    tight = controller(latency_budget_s=0.0025).begin(IterationView(
        now=0.0, running=[RunningRequest("on", True, 500)], waiting_online=[], kv_capacity=100_000)).budget
    assert tight.offline_chunk(extend=10, prefix=1200, max_new_tokens=8) == 0


def test_an_iteration_with_nothing_in_it_takes_one_unit_of_offline_work_over_the_budget() -> None:
    """A budget below any iteration (0.1 ms, the 1 ms intercept alone exceeds it) stops offline work
    only beside online work. With nothing online, the first offline decode -- or, with none, one
    minimal chunk -- runs anyway: an empty iteration protects no one and never ends."""
    idle = controller(latency_budget_s=1e-4, min_offline_chunk=8)
    plan = idle.begin(IterationView(now=0.0, running=[offline("a", 100), offline("b", 100)], waiting_online=[],
                                    kv_capacity=100_000))
    assert plan.park == ["b"]
    assert plan.budget.offline_chunk(extend=1000, prefix=0, max_new_tokens=8) == 0
    empty = idle.begin(IterationView(now=0.0, running=[], waiting_online=[], kv_capacity=100_000)).budget
    assert empty.minimal_chunk_fits(1000, 0) and not empty.fits_prefill(1000, 0, 8)
    assert empty.offline_chunk(extend=1000, prefix=0, max_new_tokens=8) == 8
    assert empty.offline_chunk(extend=5, prefix=0, max_new_tokens=8) == 5
    tight_memory = idle.begin(IterationView(now=0.0, running=[], waiting_online=[], kv_capacity=12)).budget
    assert tight_memory.offline_chunk(extend=1000, prefix=0, max_new_tokens=8) == 0  # 8 + 8 tokens exceed 12
    beside_online = idle.begin(IterationView(now=0.0, running=[RunningRequest("on", True, 100), offline("a", 100)],
                                             waiting_online=[], kv_capacity=100_000))
    assert beside_online.park == ["a"]
    assert beside_online.budget.offline_chunk(extend=1000, prefix=0, max_new_tokens=8) == 0
    echo = controller(mode="echo", ttft_slo_s=1.0, tpot_slo_s=0.1, idle_budget_s=1e-4).begin(IterationView(
        now=0.0, running=[offline("a", 100), offline("b", 100)], waiting_online=[], kv_capacity=100_000))
    assert echo.park == ["b"]


def test_no_budget_means_memory_and_chunk_room_only() -> None:
    budget = ColocationController(ColocationConfig(mode="hygen")).begin(IterationView(
        now=0.0, running=[offline("a", 10_000)], waiting_online=[], kv_capacity=100_000, chunk_tokens=64)).budget
    assert budget.offline_chunk(extend=1000, prefix=0, max_new_tokens=8) == 63


def test_hygen_offline_memory_preempts_what_online_demand_needs_and_admits_the_rest() -> None:
    """HyGen Alg. 2: online takes free memory plus what offline holds; offline work beyond that
    is preempted newest first, and offline admission gets what is left."""
    plan = ColocationController(ColocationConfig(mode="hygen")).begin(IterationView(
        now=0.0, running=[RunningRequest("on", True, 300, reserved=100), offline("a", 200), offline("b", 200)],
        waiting_online=[WaitingOnline("new", 200, 50, 0.0)], kv_capacity=1000, chunk_tokens=4096))
    # online 400 + 250, offline 2 x 210: 70 tokens short, so "b" (the newest) goes.
    assert plan.preempt == ["b"] and plan.park == []
    assert plan.budget.offline_memory == 1000 - 650 - 210
    assert plan.budget.offline_chunk(extend=1000, prefix=0, max_new_tokens=40) == 100


def test_echo_budget_is_the_tightest_deadline_with_slack_carried_forward() -> None:
    running = [RunningRequest("a", True, 100, arrival=0.0, output_tokens=10)]
    waiting = [WaitingOnline("b", 50, 8, arrival=0.8)]
    # a: 1.0 + 10 * 0.05 - 1.2 = 0.3; b: 1.0 - 0.4 = 0.6
    assert deadline_budget(1.2, running, waiting, ttft_s=1.0, tpot_s=0.05, idle_budget_s=0.1) == pytest.approx(0.3)
    assert deadline_budget(9.0, running, [], 1.0, 0.05, 0.1) == 0.0
    assert deadline_budget(1.2, [offline("x", 10)], [], 1.0, 0.05, idle_budget_s=0.1) == 0.1


def test_echo_online_reserve_caps_offline_memory() -> None:
    echo = controller(mode="echo", ttft_slo_s=1.0, tpot_slo_s=0.1, reserve_sigmas=2.0)
    for now, demand in enumerate((100, 300, 100, 300)):
        echo.demand.observe(float(now), demand)
    assert echo.demand.reserve() == 400  # mean 200 + 2 * std 100
    plan = echo.begin(IterationView(now=4.0, running=[RunningRequest("on", True, 150, reserved=50),
                                                      offline("off", 90)], waiting_online=[], kv_capacity=1000))
    # reserve over 5 samples (100, 300, 100, 300, 200) = 200 + 2 * 89.4 -> 379; offline holds 100
    assert plan.online_reserve == 379
    assert plan.budget.offline_memory == 1000 - 379 - 100


def test_demand_window_forgets_old_samples() -> None:
    window = OnlineDemandWindow(window_s=10.0, sigmas=2.0)
    window.observe(0.0, 10_000)
    window.observe(20.0, 100)
    assert window.reserve() == 100


def test_config_validation_and_runtime_change() -> None:
    with pytest.raises(ValueError, match="needs a fitted latency model"):
        ColocationConfig(mode="hygen", latency_budget_s=0.01)
    with pytest.raises(ValueError, match="echo mode needs"):
        ColocationConfig(mode="echo", latency_model=MODEL.to_dict())
    with pytest.raises(ValueError, match="unknown co-location mode"):
        ColocationConfig(mode="bros2")
    with pytest.raises(ValueError, match="unknown co-location settings"):
        ColocationConfig.from_dict({"mode": "hygen", "budget": 1})
    live = controller(latency_budget_s=0.01)
    live.reconfigure({"latency_budget_s": 0.02})
    assert live.config.latency_budget_s == 0.02
    assert ColocationConfig.from_dict(json.loads(live.config.to_json())) == live.config


def test_utility_order_interpolates_between_dfs_and_fcfs() -> None:
    dfs, fifo = [3, 1, 4, 0, 2], [0, 1, 2, 3, 4]
    assert utility_order(dfs, fifo, 1.0, random.Random(0)) == dfs
    assert utility_order(dfs, fifo, 0.0, random.Random(0)) == fifo
    mixed = utility_order(dfs, fifo, 0.5, random.Random(0))
    assert sorted(mixed) == fifo


def test_utility_order_bounds_how_long_the_oldest_request_waits() -> None:
    """Request 0 shares nothing and sits last in DFS order; with u = 0.8 it is still picked early."""
    dfs = list(range(1, 200)) + [0]
    fifo = list(range(200))
    positions = [utility_order(dfs, fifo, 0.8, random.Random(seed)).index(0) for seed in range(50)]
    assert max(positions) < 40
    assert utility_order(dfs, fifo, 1.0, random.Random(0)).index(0) == 199


def test_calibration_scales_predictions_toward_what_batches_really_took() -> None:
    live = controller(latency_budget_s=0.004, calibration_alpha=0.5)
    view = IterationView(now=0.0, running=[RunningRequest("on", True, 1000), offline("a", 1000)],
                         waiting_online=[], kv_capacity=100_000)
    assert live.begin(view).park == []  # 1 ms + 1 ms + 1 ms predicted
    for _ in range(20):
        live.observe(model_s=0.002, measured_s=0.006, requests=2)  # the machine runs three times slower
    assert live.calibration == pytest.approx(3.0, rel=1e-3)
    plan = live.begin(view)
    assert plan.budget.predicted_s() == pytest.approx(0.006, rel=1e-3) and plan.budget.model_s() == pytest.approx(0.002)
    assert plan.park == ["a"]
    frozen = controller(latency_budget_s=0.004, calibration_alpha=0.0)
    frozen.observe(0.002, 0.006, 2)
    assert frozen.calibration == 1.0


def host_of(controller_: ColocationController, *gaps: tuple[int, float]) -> ColocationController:
    for requests, gap_s in gaps:
        controller_.observe_host(requests, gap_s)
    return controller_


def test_a_period_the_host_bounds_leaves_the_calibration_alone() -> None:
    """The host takes 6 ms after every batch, whatever its size: a 6 ms period of a batch the
    model prices at 2 ms is the host's, not a device three times slower. Where the host keeps
    up (0.5 ms), the same period still calibrates."""
    host_bound = host_of(controller(latency_budget_s=0.004, calibration_alpha=0.5), (1, 0.006), (10, 0.006))
    host_bound.observe(model_s=0.002, measured_s=0.006, requests=2)
    assert host_bound.calibration == 1.0
    device_bound = host_of(controller(latency_budget_s=0.004, calibration_alpha=0.5), (1, 0.0005), (10, 0.0005))
    device_bound.observe(model_s=0.002, measured_s=0.006, requests=2)
    assert device_bound.calibration == pytest.approx(2.0)


def test_offline_decodes_the_device_finishes_within_the_hosts_time_are_kept() -> None:
    """A budget by state (1 ms headroom, TBT target 3 ms); one online decode (2 ms) and three
    offline ones (1 ms each). A host that keeps up leaves room for one. A host that takes 6 ms
    whatever the batch makes the online part last 6 ms, the budget's floor, and all three fit in
    it. A fixed budget stays the cap it was set to: nothing fits under 3 ms then."""
    view = IterationView(now=0.0, running=[RunningRequest("on", True, 1000), offline("a", 1000), offline("b", 1000),
                                           offline("c", 1000)], waiting_online=[], kv_capacity=100_000)
    by_state = {"headroom_s": 0.001, "tpot_slo_s": 0.003}
    assert controller(**by_state).begin(view).park == ["b", "c"]
    plan = host_of(controller(**by_state), (1, 0.006), (10, 0.006)).begin(view)
    assert plan.park == [] and plan.budget.latency_s == pytest.approx(0.006 * (1 + NEAR_ZERO_FRACTION))
    assert host_of(controller(latency_budget_s=0.003), (1, 0.006), (10, 0.006)).begin(view).park == ["a", "b", "c"]


def test_the_hosts_time_per_request_counts_against_offline_decodes() -> None:
    """0.8 ms of host time per request, a 2.6 ms budget: the device would run the online decode
    and three short offline ones in 2.3 ms, but four requests take the host 3.2 ms."""
    view = IterationView(now=0.0, running=[RunningRequest("on", True, 1000), offline("a", 100), offline("b", 100),
                                           offline("c", 100)], waiting_online=[], kv_capacity=100_000)
    assert controller(latency_budget_s=0.0026).begin(view).park == []
    per_request = host_of(controller(latency_budget_s=0.0026), (1, 0.0008), (4, 0.0032))
    assert per_request.begin(view).park == ["c"]


def test_the_mode_calibrates_on_the_period_online_requests_wait_not_the_forward_alone() -> None:
    """A host-bound engine: forwards of 1 ms, launched every 30 ms. A batch's period is measured
    at the next launch, and a launch after an idle spell measures none."""
    mode = ColocationMode(ColocationConfig(mode="hygen", latency_budget_s=0.01, calibration_alpha=1.0,
                                           latency_model=MODEL.to_dict()))
    batch = {"decode_reqs": 4, "prefill_reqs": 0, "forward_s": 0.001}
    mode.forward_done({**batch, "model_s": 0.01}, 0.001)  # the first batch: no period yet
    assert mode.state is not None and mode.state.controller.calibration == 1.0
    mode.forward_done({**batch, "model_s": 0.02, "period_s": 0.03}, 0.001)
    assert mode.state.controller.calibration == pytest.approx(3.0)  # the first batch: 30 ms over 10 ms
    mode.forward_done({**batch, "model_s": 0.01}, 0.001)  # after an idle spell
    assert mode.state.controller.calibration == pytest.approx(3.0)
    mode.forward_done({**batch, "model_s": 0.01, "period_s": 0.005}, 0.001)
    assert mode.state.controller.calibration == pytest.approx(0.5)
    # The gaps (period less the forward before) teach the host's time, fitted once batches of two
    # sizes have been seen; until then every period calibrates.
    assert mode.state.controller.host.seconds(4) == 0.0
    mode.forward_done({**batch, "decode_reqs": 8, "model_s": 0.001, "period_s": 0.03}, 0.001)
    assert mode.state.controller.calibration == pytest.approx(3.0)
    mode.forward_done({**batch, "model_s": 0.001, "period_s": 0.03}, 0.001)
    assert mode.state.controller.host.seconds(8) > 0.02
    # the 8-request batch's 30 ms were the host's: not a device 30 times slower than its 1 ms
    assert mode.state.controller.calibration == pytest.approx(3.0)


def test_hygen_budget_switches_with_the_online_state() -> None:
    """Headroom 2 ms over the predicted online part, capped by the TBT target (4 ms) while online
    requests decode and by the TTFT slack of a waiting one; the TTFT slack (7 ms) when no online
    request is present; never below the online part (plus 1%) however tight the caps."""
    hygen = controller(headroom_s=0.002, tpot_slo_s=0.004, ttft_slo_s=0.1, idle_budget_s=0.007)
    idle = hygen.begin(IterationView(now=10.0, running=[offline("a", 1000)], waiting_online=[], kv_capacity=100_000))
    assert idle.budget.latency_s == pytest.approx(0.007)
    # One online decode of 500 tokens: 1.5 ms predicted, + 2 ms headroom = 3.5 ms, under the 4 ms cap.
    decoding = hygen.begin(IterationView(now=10.0, running=[RunningRequest("on", True, 500), offline("a", 1000)],
                                         waiting_online=[], kv_capacity=100_000))
    assert decoding.budget.latency_s == pytest.approx(0.0035)
    # Online decodes of 2500 tokens: 3.5 ms + 2 ms is capped at the TBT target.
    long = hygen.begin(IterationView(now=10.0, running=[RunningRequest("on", True, 2500)], waiting_online=[],
                                     kv_capacity=100_000))
    assert long.budget.latency_s == pytest.approx(0.004)
    # A waiting prompt that has waited 97.5 ms of its 100: 2.5 ms for the whole iteration, half a
    # millisecond more than its own prefill (1 ms + 100 tokens at 10 µs), less than the headroom allows.
    waiting = hygen.begin(IterationView(now=10.0, running=[], waiting_online=[WaitingOnline("new", 100, 8, 9.9025)],
                                        kv_capacity=100_000))
    assert waiting.budget.latency_s == pytest.approx(0.0025)
    # One that is already late: its prefill (4 ms) runs, and offline work gets 1% beside it.
    late = hygen.begin(IterationView(now=10.0, running=[], waiting_online=[WaitingOnline("new", 300, 8, 9.0)],
                                     kv_capacity=100_000))
    assert late.budget.latency_s == pytest.approx(0.004 * (1 + NEAR_ZERO_FRACTION))
