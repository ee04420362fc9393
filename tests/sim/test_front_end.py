"""The simulator's front end: crossings read from a replay's sends and iteration records, added to
simulated first tokens.

Records are written in the iteration log's format (`sglang_plugin.iteration_log`, whose
``online_received`` a server test checks against a live scheduler); the module reads nothing else.
"""

from __future__ import annotations

import pytest

from sgl_blend.core.request_timing import RequestTiming
from sgl_blend.sim.front_end import FrontEnd


def test_crossings_pair_the_kth_send_with_the_kth_receipt_and_end_at_its_first_tokens_batch() -> None:
    """Two requests, listed out of order: each is matched by time, first come first served. The
    first prompt fits the batch that admits it; the later one is prefilled in two chunks, so its way
    back starts at the end of the batch that completed it, not of the one that admitted it."""
    sent = [(100.050, 0.040), (100.000, 0.030)]
    records = [
        {"wall": 100.020, "online_received": [100.004], "online_prefilled": [100.004]},
        {"wall": 100.065, "online_received": [100.060]},
        {"wall": 100.075, "online_prefilled": [100.060]},
        {"wall": 100.080},  # a batch that admitted nothing
    ]
    front = FrontEnd.measure(sent, records)
    assert [part for pair in front.delays for part in pair] == pytest.approx([0.004, 0.010, 0.010, 0.015])
    assert front.summary()["both_p50_ms"] == pytest.approx(19.5)


def test_a_replay_the_records_do_not_match_is_refused() -> None:
    admitted = {"wall": 1.05, "online_received": [1.01], "online_prefilled": [1.01]}
    with pytest.raises(ValueError, match="admit 1 online requests, the replay sent 2"):
        FrontEnd.measure([(1.0, 0.1), (2.0, 0.1)], [admitted])
    with pytest.raises(ValueError, match="no first token"):
        FrontEnd.measure([(1.0, None)], [admitted])
    with pytest.raises(ValueError, match="no record holds the first token"):
        FrontEnd.measure([(1.0, 0.1)], [{"wall": 1.05, "online_received": [1.01]}])


def test_each_first_token_crosses_one_measured_requests_front_end_in_place_of_its_wait() -> None:
    """The simulated engine took each request in 2 ms after its send; the measured way to the
    scheduler holds that wait already, so it is replaced, not added to."""
    front = FrontEnd(((0.010, 0.020), (0.100, 0.200)))
    timings = [RequestTiming(0.0, ttft=0.005, received=0.002) for _ in range(200)]
    timings.append(RequestTiming(0.0, error="lost"))
    later = front.add_to(timings, seed=3)
    assert {round(timing.ttft - 0.003, 6) for timing in later[:200]} == {0.03, 0.3}
    assert later[200].ttft is None and timings[0].ttft == 0.005  # the input is left as it was
    assert [timing.ttft for timing in front.add_to(timings, seed=3)] == [timing.ttft for timing in later]


def test_a_first_token_without_its_receipt_is_refused() -> None:
    with pytest.raises(ValueError, match="without its receipt"):
        FrontEnd(((0.010, 0.020),)).add_to([RequestTiming(0.0, ttft=0.005)], seed=0)
