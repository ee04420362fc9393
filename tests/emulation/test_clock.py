"""The device clock adds priced forwards and idle wall time; the reader turns two readings of a
server into a job's emulated seconds."""

from __future__ import annotations

import pytest

from sgl_blend.emulation.clock import DeviceClock
from sgl_blend.emulation.clock_reader import ClockReading, emulated_seconds, job_time
from sgl_blend.emulation.pricing import batch_shape


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_forwards_add_their_price_and_idle_adds_wall_time() -> None:
    time = FakeTime()
    clock = DeviceClock(now=time)
    time.now += 1.0
    clock.idle()
    time.now += 2.5
    clock.idle()
    time.now += 0.5
    clock.busy()
    clock.forward("prefill", batch_shape([(100, 0)]), 0.25)
    time.now += 7.0
    clock.forward("decode", batch_shape(decode_contexts=[101]), 0.125)
    state = clock.state()
    assert state["device_seconds"] == 0.375
    assert state["idle_wall_seconds"] == 3.0
    assert state["wall_seconds"] == 11.0
    assert state["forwards"] == 2
    assert state["by_kind"]["prefill"] == {"forwards": 1, "device_seconds": 0.25, "tokens": 100, "measured_seconds": 0.0}
    assert [record["kind"] for record in state["recent"]] == ["prefill", "decode"]


def test_an_idle_interval_under_way_counts_up_to_the_reading() -> None:
    time = FakeTime()
    clock = DeviceClock(now=time)
    clock.idle()
    time.now += 4.0
    assert clock.state()["idle_wall_seconds"] == 4.0
    time.now += 1.0
    clock.forward("decode", batch_shape(decode_contexts=[5]), 0.01)
    time.now += 9.0
    assert clock.state()["idle_wall_seconds"] == 5.0


def test_measured_time_is_kept_beside_the_price() -> None:
    clock = DeviceClock(now=FakeTime())
    clock.forward("mixed", batch_shape([(10, 0)], [20]), 0.5, measured_s=2.0)
    state = clock.state()
    assert state["by_kind"]["mixed"]["measured_seconds"] == 2.0
    assert state["recent"][0]["measured_seconds"] == 2.0


def test_only_the_latest_forwards_keep_their_shapes() -> None:
    clock = DeviceClock(now=FakeTime(), recent=2)
    for _ in range(5):
        clock.forward("decode", batch_shape(decode_contexts=[1]), 1.0)
    state = clock.state()
    assert (len(state["recent"]), state["recent_dropped"], state["device_seconds"]) == (2, 3, 5.0)


def info(*ranks: tuple[int, float, float]) -> dict:
    return {"internal_states": [{"sgl_blend": {"dp_rank": rank, "emulation": {
        "device_seconds": device, "idle_wall_seconds": idle}}} for rank, device, idle in ranks]}


def test_a_jobs_emulated_time_is_device_plus_idle_time_of_its_slowest_rank() -> None:
    before = ClockReading.from_server_info(info((1, 5.0, 1.0), (0, 2.0, 3.0)))
    after = ClockReading.from_server_info(info((0, 10.0, 4.0), (1, 8.0, 1.5)))
    assert emulated_seconds(before, after) == pytest.approx(max(8.0 + 1.0, 3.0 + 0.5))


def test_a_jobs_time_leaves_out_the_idle_after_its_last_forward() -> None:
    time = FakeTime()
    clock = DeviceClock(now=time)
    clock.idle()
    time.now += 2.0
    before = ClockReading({0: clock.state()})
    time.now += 1.0  # the job's warm-up: lines remain, nothing runs yet
    clock.forward("prefill", batch_shape([(100, 0)]), 4.0)
    clock.idle()
    time.now += 7.0  # after the job's last forward: the runner commits and reports
    job = job_time(before, ClockReading({0: clock.state()}))
    assert (job.device_seconds, job.idle_seconds, job.seconds) == (4.0, 1.0, 5.0)



def test_in_real_time_idle_wall_time_counts_over_the_factor() -> None:
    """A forward of 4 device seconds lasts 8 wall seconds at factor 2, so 2 wall seconds idle are
    1 device second."""
    time = FakeTime()
    clock = DeviceClock(now=time)
    before = ClockReading({0: {**clock.state(), "wall_per_device_second": 2.0}})
    clock.idle()
    time.now += 2.0
    clock.forward("prefill", batch_shape([(100, 0)]), 4.0)
    after = ClockReading({0: {**clock.state(), "wall_per_device_second": 2.0}})
    job = job_time(before, after)
    assert (job.device_seconds, job.idle_seconds) == (4.0, 1.0)
    assert emulated_seconds(before, after) == 5.0

def test_a_server_that_emulates_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="emulates no device"):
        ClockReading.from_server_info({"internal_states": [{"sgl_blend": {"dp_rank": 0}}]})
