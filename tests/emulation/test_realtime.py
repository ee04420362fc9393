"""The real-time pacer: a forward ends its price times the factor after the device began it; back to
back forwards begin where the last one ended (host work between them is hidden, as the overlap
scheduler hides it), after idling they begin when called, and a host slower than the device is
counted, never slept for."""

from __future__ import annotations

import pytest

from sgl_blend.emulation.config import EmulationConfig
from sgl_blend.emulation.realtime import RealTimePacer


class FakeTime:
    def __init__(self) -> None:
        self.now = 50.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_forwards_last_their_price_times_the_factor_with_host_gaps_hidden_and_lateness_counted() -> None:
    time = FakeTime()
    pacer = RealTimePacer(2.0, now=time, sleep=time.sleep)
    pacer.run(0.010)                       # begins now: ends 20 ms later
    assert time.slept == [pytest.approx(0.020)]
    time.now += 0.005                      # 5 ms of host work before the next forward
    pacer.run(0.010)                       # began when the last ended: 15 ms left to sleep
    assert time.slept[-1] == pytest.approx(0.015)
    time.now += 0.030                      # the host took longer than the device would
    pacer.run(0.010)
    assert len(time.slept) == 2
    state = pacer.state()
    assert state["behind_forwards"] == 1 and state["behind_s"] == pytest.approx(0.010)
    assert state["host_gap_s"] == pytest.approx(0.035) and state["forwards"] == 3
    pacer.idle()                           # after idling, the next forward begins when called
    time.now += 1.0
    pacer.run(0.001)
    assert time.slept[-1] == pytest.approx(0.002) and pacer.state()["behind_forwards"] == 1


def test_the_factor_is_for_skipped_forwards_only() -> None:
    assert EmulationConfig("h100", "llama-3.1-8b", token_id=5, realtime_factor=1.5).realtime_factor == 1.5
    with pytest.raises(ValueError, match="positive"):
        EmulationConfig("h100", "llama-3.1-8b", token_id=5, realtime_factor=0)
    with pytest.raises(ValueError, match="real forward"):
        EmulationConfig("cpu", "tiny-llama", realtime_factor=2.0)
