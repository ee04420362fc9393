"""A co-locating engine's window follows what its scheduler reports: its queue and its running
batch. Lines the report does not show yet -- still being tokenized -- must not grow it."""

from __future__ import annotations

from sgl_blend.server.window import QUEUE_FLOOR, RankLoad, colocated_window

FULL = 400


def test_lines_the_engine_has_not_received_do_not_count_as_running() -> None:
    # 64 lines sent, none in the queue yet, and the engine runs one (online) request.
    assert colocated_window(FULL, 64, RankLoad(waiting=0, running=1)) == 1 + QUEUE_FLOOR


def test_the_window_doubles_what_the_engine_runs() -> None:
    assert colocated_window(FULL, 50, RankLoad(waiting=10, running=40)) == 80
    assert colocated_window(FULL, 300, RankLoad(waiting=20, running=280)) == FULL


def test_parked_lines_are_in_flight_but_not_running() -> None:
    # 50 lines in flight: 10 waiting, 5 decoding, 35 parked with their KV held.
    assert colocated_window(FULL, 50, RankLoad(waiting=10, running=5)) == 5 + QUEUE_FLOOR


def test_online_requests_the_engine_runs_count_only_as_far_as_lines_are_out_of_the_queue() -> None:
    assert colocated_window(FULL, 40, RankLoad(waiting=40, running=30)) == QUEUE_FLOOR
