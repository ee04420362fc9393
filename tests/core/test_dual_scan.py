"""The dual scan keeps the KV-weighted density of admitted work at the root's, and handles the
degenerate cases explicitly."""

from __future__ import annotations

import pytest

from sgl_blend.core.dual_scan import COMPUTE, MEMORY, DualScanner


def scanner_for(costs: dict[int, tuple[float, float]], boundary: int, capacity: float, size: float = 10.0) -> DualScanner:
    order = sorted(costs, key=lambda request: costs[request][0] / costs[request][1], reverse=True)
    return DualScanner(order, boundary, capacity, costs.__getitem__, lambda _request: size)


def blended_density(scanner: DualScanner, costs) -> float:
    weighted = sum(scanner.held[r] * costs[r][0] / costs[r][1] for r in scanner.side_of)
    return weighted / sum(scanner.held[r] for r in scanner.side_of)


def test_blended_density_tracks_the_root_while_both_sides_hold_requests() -> None:
    costs = {request: (4.0, 1.0) for request in range(300)}
    costs.update({request: (0.1, 1.0) for request in range(300, 900)})
    scanner = scanner_for(costs, boundary=300, capacity=2000.0)
    root = sum(c for c, _m in costs.values()) / sum(m for _c, m in costs.values())
    running: list[int] = []
    checked = 0
    while scanner.pending():
        for request, side in scanner.propose(free=1e9, limit=1000):
            scanner.admit(request, side)
            running.append(request)
        sides = set(scanner.side_of.values())
        if sides == {COMPUTE, MEMORY} and scanner.budgets()[COMPUTE] > 0 and scanner.budgets()[MEMORY] > 0:
            assert blended_density(scanner, costs) == pytest.approx(root, rel=0.10)
            checked += 1
        for request in running[:20]:
            scanner.release(request)
        running = running[20:]
    assert checked > 5


def test_one_side_empty_gives_the_other_all_memory() -> None:
    costs = {request: (1.0, 1.0) for request in range(10)}
    scanner = scanner_for(costs, boundary=10, capacity=100.0)
    assert scanner.budgets() == {COMPUTE: 100.0, MEMORY: 0.0}
    proposal = scanner.propose(free=1e9, limit=100)
    assert [side for _request, side in proposal] == [COMPUTE] * 10


def test_equal_densities_split_memory_evenly() -> None:
    costs = {request: (1.0, 1.0) for request in range(10)}
    scanner = scanner_for(costs, boundary=5, capacity=100.0)
    assert scanner.budgets() == {COMPUTE: 50.0, MEMORY: 50.0}


def test_each_side_waits_for_its_own_memory_and_early_finish_frees_it() -> None:
    costs = {request: (4.0, 1.0) for request in range(5)}
    costs.update({request: (0.25, 1.0) for request in range(5, 10)})
    scanner = scanner_for(costs, boundary=5, capacity=40.0)
    first = scanner.propose(free=1e9, limit=100)
    for request, side in first:
        scanner.admit(request, side)
    assert scanner.propose(free=1e9, limit=100) == []
    finished = next(request for request, side in first if side == COMPUTE)
    scanner.release(finished)
    again = scanner.propose(free=1e9, limit=100)
    assert again and all(side == COMPUTE for _request, side in again)


def test_underestimated_request_moves_to_the_memory_side() -> None:
    costs = {0: (4.0, 1.0), 1: (0.2, 1.0)}
    scanner = scanner_for(costs, boundary=1, capacity=100.0)
    for request, side in scanner.propose(free=1e9, limit=10):
        scanner.admit(request, side)
    scanner.move_to_memory_side(0, 30.0)
    assert scanner.side_of[0] == MEMORY
    assert scanner.used == {COMPUTE: 0.0, MEMORY: 40.0}


def test_preempted_request_is_offered_again_first() -> None:
    costs = {request: (1.0, 1.0) for request in range(4)}
    scanner = scanner_for(costs, boundary=4, capacity=20.0)
    admitted = scanner.propose(free=1e9, limit=10)
    for request, side in admitted:
        scanner.admit(request, side)
    scanner.requeue(admitted[0][0])
    assert scanner.propose(free=1e9, limit=1)[0][0] == admitted[0][0]
