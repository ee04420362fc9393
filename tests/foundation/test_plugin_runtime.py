"""The plugin runtime without a server: which mode each co-location setting runs, and the rule
that a failing part switches itself off (logged once) while the rest keeps going."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.sglang_plugin.guard import SWITCHED_OFF
from sgl_blend.sglang_plugin.modes import Mode, make_mode
from sgl_blend.sglang_plugin.modes.bros import BrosMode, BrosState
from sgl_blend.sglang_plugin.modes.colocation import ColocationMode
from sgl_blend.sglang_plugin.runtime import PluginRuntime
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings

MODEL = {"form": "hygen", "coefficients": {"intercept": 1e-3, "S_p": 1e-5, "S_d": 0.0, "S_p^2": 0.0, "S_d^2": 0.0,
                                            "N_p": 0.0, "N_d": 0.0}}
BROS_MODEL = {"form": "bros", "coefficients": {"b_prefill": 5e-3, "a0_prefill": 2e-5, "a1_prefill": 0.0,
                                                "b_decode": 5e-3, "a0_decode": 1e-3, "a1_decode": 0.0}}


class ExplodingPool:
    def order_waiting_queue(self, waiting_queue: list) -> None:
        raise RuntimeError("boom")

    def release(self, waiting_queue: list, free_kv_tokens: int) -> None:
        raise RuntimeError("boom")


class TreeCache:
    class token_to_kv_pool_allocator:
        @staticmethod
        def available_size() -> int:
            return 100

    @staticmethod
    def evictable_size() -> int:
        return 0


def test_each_colocation_setting_runs_its_mode() -> None:
    assert type(make_mode(ColocationConfig())) is Mode
    hygen = make_mode(ColocationConfig(mode="hygen", latency_model=MODEL))
    echo = make_mode(ColocationConfig(mode="echo", ttft_slo_s=1.0, tpot_slo_s=0.1, latency_model=MODEL))
    assert isinstance(hygen, ColocationMode) and not hygen.kv_priorities
    assert isinstance(echo, ColocationMode) and echo.kv_priorities
    assert isinstance(make_mode(ColocationConfig(mode="bros", latency_model=BROS_MODEL)), BrosMode)


def test_a_failing_pool_is_switched_off_once_and_the_rest_keeps_going(caplog: pytest.LogCaptureFixture) -> None:
    runtime = PluginRuntime(PluginSettings(offline_policy=OFF))
    runtime.pool = ExplodingPool()  # type: ignore[assignment]
    queue: list[Any] = []
    before = len(SWITCHED_OFF)
    with caplog.at_level(logging.ERROR):
        runtime.order_waiting_queue(queue, TreeCache())
        runtime.order_waiting_queue(queue, TreeCache())
    assert runtime.pool is None and runtime.recorder is not None
    assert SWITCHED_OFF[before:] == ["PluginRuntime.pool"]  # what /server_info reports
    assert [record.message for record in caplog.records].count(
        "sgl-blend offline pool failed; falling back to SGLang's own scheduling") == 1
    assert runtime.may_admit(object()) is None


def test_a_pool_that_fails_gives_its_backlog_back_to_sglangs_queue() -> None:
    """Offline requests waiting outside SGLang's queue are not lost when the pool switches off."""

    class Scheduler:
        tree_cache = TreeCache()
        waiting_queue: list[Any] = ["online"]

    runtime = PluginRuntime(PluginSettings(offline_policy=OFF))
    runtime.pool = ExplodingPool()  # type: ignore[assignment]
    runtime.backlog.update({"a": "offline-a", "b": "offline-b"})
    scheduler = Scheduler()
    runtime.release_offline(scheduler)
    assert runtime.pool is None
    assert scheduler.waiting_queue == ["online", "offline-a", "offline-b"] and not runtime.backlog


def test_settings_changes_reach_the_running_mode_and_restart_a_failed_one() -> None:
    mode = make_mode(ColocationConfig(mode="hygen", latency_model=MODEL))
    assert mode.reconfigure({"latency_budget_s": 0.05}).latency_budget_s == 0.05
    assert mode.current_config().latency_budget_s == 0.05
    mode.state = None
    assert mode.reconfigure({"latency_budget_s": 0.02}).latency_budget_s == 0.02 and mode.state is not None


def test_bros_learns_the_host_gap_from_the_records_and_nothing_across_an_idle_spell() -> None:
    """A batch of n requests is followed by a gap of 2 ms + 0.1 ms per request: the period of the
    next launch less that batch's forward. After an idle spell the record has no period."""
    state = BrosState(ColocationConfig(mode="bros", latency_model=BROS_MODEL), max_running=64)

    def record(requests: int, forward_s: float, period_s: float | None) -> dict[str, Any]:
        timing = {"forward_s": forward_s} if period_s is None else {"forward_s": forward_s, "period_s": period_s}
        return {"prefill_reqs": 1, "decode_reqs": requests - 1, **timing}

    previous = (10, 0.005)
    state.forward_done(record(*previous, None), previous[1])
    for requests in (100, 10, 100, 10, 100):
        gap = 0.002 + 0.0001 * previous[0]
        state.forward_done(record(requests, 0.005, previous[1] + gap), 0.005)
        previous = (requests, 0.005)
    assert state.host.intercept_s == pytest.approx(0.002) and state.host.per_request_s == pytest.approx(0.0001)
    learnt = (state.host.intercept_s, state.host.per_request_s)
    state.forward_done(record(50, 0.005, None), 0.005)  # after an idle spell: no period
    assert (state.host.intercept_s, state.host.per_request_s) == learnt
    state.forward_done(record(50, 0.005, 10.0), 0.005)  # the gap after a batch of 50: learnt
    assert state.host.seconds(50) > learnt[0] + learnt[1] * 50
    assert state.cost.predict(BatchShape().with_decode(100)) > state.cost.model.predict(BatchShape().with_decode(100))


def test_bros_asked_to_plan_to_a_tail_learns_it_from_each_plan_and_the_period_that_followed() -> None:
    """Each record carries its plan's prediction and the margin inside it; the next record's
    period is how long that batch took. Periods 30 ms past their plans' means make the margin
    30 ms; a record with no plan (a decode batch after one) teaches nothing. Without the
    setting BROS plans to the mean and learns no tail."""
    config = ColocationConfig(mode="bros", latency_model=BROS_MODEL, bros_tail_quantile=0.9)
    state = BrosState(config, max_running=64)
    assert state.cost.margin_s() == 0.0

    def record(period_s: float | None, margin_s: float | None) -> dict[str, Any]:
        planned = {} if margin_s is None else {"predicted_s": 0.05 + margin_s, "margin_s": margin_s}
        timing = {"forward_s": 0.01} if period_s is None else {"forward_s": 0.01, "period_s": period_s}
        return {"prefill_reqs": 0, "decode_reqs": 10, **timing, **planned}

    state.forward_done(record(None, 0.0), 0.01)
    for _ in range(20):
        state.forward_done(record(0.08, state.cost.margin_s()), 0.01)
    assert state.cost.margin_s() == pytest.approx(0.03)
    state.forward_done(record(0.08, None), 0.01)
    state.forward_done(record(0.5, 0.03), 0.01)  # follows the unplanned batch: not learnt
    assert state.cost.margin_s() == pytest.approx(0.03)
    assert state.snapshot()["margin_s"] == pytest.approx(0.03)
    mean = BrosState(ColocationConfig(mode="bros", latency_model=BROS_MODEL), max_running=64)
    for _ in range(20):
        mean.forward_done(record(0.5, 0.0), 0.01)
    assert mean.tail is None and mean.cost.margin_s() == 0.0
