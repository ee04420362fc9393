"""The simulator's host: gaps read from iteration records, and iterations that wait for them.

Records are written here in the iteration log's format (`sglang_plugin.iteration_log`): the
module reads nothing else from them, and a server run long enough to give gaps in every class
would cost minutes for what a dozen lines show.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_blend.core.host_gap import HostTime
from sgl_blend.core.colocation import ColocationConfig, ColocationController
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.forward_time.step_time import IterationClock, NoisyClock
from sgl_blend.measure.latency_profile import read_records
from sgl_blend.measure.online_replay import summarize
from sgl_blend.sim.colocation import ColocatedConfig, ColocatedEngine
from sgl_blend.sim.host import MIN_CLASS_GAPS, HostBoundClock, HostGaps
from tests.colocation.test_colocation_sim import COST, HARDWARE, HORIZON_S, MODEL, STEP, offline_pool, online_load


def record(decodes: int, forward_s: float, period_s: float | None = None, offline: bool = True) -> dict:
    line = {"decode_reqs": decodes, "prefill_reqs": 0, "offline_prefill": 0, "offline_decode": decodes * offline,
            "forward_s": forward_s}
    if period_s is not None:
        line["period_s"] = period_s
    return line


class FixedClock:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def measure(self, shape: BatchShape) -> float:
        return self.seconds


def test_a_gap_is_the_next_period_less_this_forward_and_idle_spells_give_none(tmp_path: Path) -> None:
    log = tmp_path / "records.jsonl"
    lines = [
        record(4, 0.010),
        record(4, 0.008, period_s=0.013),  # 3 ms after a 4-request batch
        record(100, 0.020, period_s=0.009),  # 1 ms after a 4-request batch
        record(100, 0.020),  # after an idle spell: no period, no gap
        record(100, 0.020, period_s=0.045),  # 25 ms after a 100-request batch
        record(100, 0.020, period_s=0.045, offline=False),  # after a 100-request batch, kept
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))

    gaps = HostGaps.measure(read_records(log))

    assert gaps.gaps_for(4) == pytest.approx((0.001, 0.003))
    assert gaps.gaps_for(100) == pytest.approx((0.025, 0.025))
    # Classes without a measurement borrow the nearest measured one.
    assert gaps.gaps_for(20) == gaps.gaps_for(4)
    assert gaps.gaps_for(1000) == gaps.gaps_for(100)
    assert [row["count"] for row in gaps.summary()] == [2, 2]


def test_a_class_with_a_few_gaps_draws_from_the_nearest_class_with_enough() -> None:
    few, many, far = (0.010, 0.009), tuple(0.005 for _ in range(MIN_CLASS_GAPS)), (0.002,) * MIN_CLASS_GAPS
    gaps = HostGaps(((), few, (), many, (), (), far))

    assert gaps.gaps_for(12) == gaps.gaps_for(4) == gaps.gaps_for(50) == many
    assert gaps.gaps_for(1000) == far
    assert [row["count"] for row in gaps.summary()] == [2, MIN_CLASS_GAPS, MIN_CLASS_GAPS]  # reported as measured


def test_kept_records_choose_which_gaps_count(tmp_path: Path) -> None:
    lines = [record(4, 0.010, offline=False), record(4, 0.010, period_s=0.030), record(4, 0.010, period_s=0.012)]

    gaps = HostGaps.measure(lines, keep=lambda line: bool(line["offline_decode"]))

    assert gaps.gaps_for(4) == pytest.approx((0.002,))
    with pytest.raises(ValueError, match="no host gaps"):
        HostGaps.measure(lines, keep=lambda line: False)


def test_an_iteration_lasts_its_forward_or_the_host_gap_whichever_is_longer() -> None:
    host = HostGaps(((0.004,), (), (), (), (), (), (0.050,)))
    shape_small = BatchShape().with_decode(100)
    shape_large = BatchShape(decode_reqs=300, decode_context=30000, decode_max_context=100)

    assert HostBoundClock(FixedClock(0.010), host).measure(shape_small) == 0.010
    assert HostBoundClock(FixedClock(0.010), host).measure(shape_large) == 0.050


def test_a_scheduler_learning_the_host_sees_each_batch_and_the_gap_drawn_for_it() -> None:
    """BROS's host-time model learns from what the clock hands its observer, so a simulated BROS
    plans with the host's time as the plugin does; a batch past the last class draws that class."""
    host = HostGaps(((0.004,), (), (), (), (), (), (0.050,)))
    learnt = HostTime()
    clock = HostBoundClock(FixedClock(0.010), host, observer=learnt.observe)

    for requests in (4, 300, 4, 300):
        clock.measure(BatchShape(decode_reqs=requests, decode_context=requests * 100, decode_max_context=100))

    assert learnt.seconds(4) == pytest.approx(0.004)
    assert learnt.seconds(300) == pytest.approx(0.050)


def test_a_host_slower_than_the_device_slows_online_and_offline_work_in_the_simulator() -> None:
    """The same co-located run, once with a host that keeps up and once with one 10 ms behind
    every batch: the second makes fewer offline tokens and online requests wait longer."""

    def run(clock: IterationClock) -> tuple[float, float]:
        engine = ColocatedEngine(
            clock,
            ColocationController(ColocationConfig(mode="hygen")),
            make_offline_policy("psm", MODEL, HARDWARE),
            ColocatedConfig(COST.kv_capacity_tokens()),
        )
        result = engine.run(online_load(), offline_pool(), HORIZON_S)
        return result.offline_output_tokens_per_s(), summarize(result.online)["ttft_mean"]

    device = NoisyClock(STEP, jitter=0.0)
    slow_host = HostGaps(tuple((0.010,) for _ in range(7)))
    offline_fast, ttft_fast = run(device)
    offline_slow, ttft_slow = run(HostBoundClock(device, slow_host))

    assert offline_slow < offline_fast
    assert ttft_slow > ttft_fast
