"""The dual scan keeps the blend of admitted work at the root's density, paces each side so its
requests enter staggered, lets neither side's growth take the other's memory, and handles the
degenerate cases explicitly."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from sgl_blend.core.cost_model import memory_partition, reserve_at
from sgl_blend.core.dual_scan import COMPUTE, MEMORY, PLANNED_UTILISATION, DualScanner
from sgl_blend.core.scan_load import Load, commitment_bound, peak_commitment


def load(comp: float, mem: float, *, steps: int = 10, commit: float = 10.0, prefill: int = 10,
         prompt: int = 10) -> Load:
    return Load(comp=comp, mem=mem, prefill=prefill, steps=steps, commit=commit, prompt=prompt,
                unshared_prompt=prompt, max_new_tokens=steps, exact=True)


def commitment_at(load: Load, decoded: int) -> float:
    """KV tokens SGLang's admission counts against a request after ``decoded`` tokens: its
    unshared prompt, its output so far, and the decode room it reserves."""
    return float(load.unshared_prompt + decoded + reserve_at(decoded, load.max_new_tokens, load.exact))


def scanner_for(loads: dict[int, Load], boundary: int, capacity: float, paced: bool = False) -> DualScanner:
    order = sorted(loads, key=lambda request: loads[request].comp / loads[request].mem, reverse=True)
    return DualScanner(order, boundary, capacity, loads.__getitem__, paced=paced)


@dataclass
class TinyEngine:
    """Runs a scanner the way an engine does: each iteration it admits what is proposed and fits
    in ``capacity`` (counting what running requests commit now) while the paced prefill budget
    lasts, advances the clock, reports progress, and finishes requests after their ``steps``
    iterations."""

    scanner: DualScanner
    loads: dict[int, Load]
    capacity: float
    running: dict[int, int] = field(default_factory=dict)
    admitted_at: dict[int, int] = field(default_factory=dict)
    finished_at: dict[int, int] = field(default_factory=dict)
    iteration: int = 0
    peak_memory_side: float = 0.0

    def committed(self, side: str | None = None) -> float:
        return sum(commitment_at(self.loads[request], decoded) for request, decoded in self.running.items()
                   if side is None or self.scanner.side(request) == side)

    def step(self) -> None:
        free = self.capacity - self.committed()
        room = self.scanner.prefill_budget() if self.scanner.paced else None
        for request, side in self.scanner.propose(free, 1000):
            if room is not None and room <= 0:
                break
            room = None if room is None else room - self.loads[request].prefill
            self.scanner.admit(request, side)
            self.running[request] = 0
            self.admitted_at[request] = self.iteration
        self.iteration += 1
        self.scanner.advance(1)
        for request in list(self.running):
            self.running[request] += 1
            self.scanner.progress(request, self.running[request])
            if self.running[request] >= self.loads[request].steps:
                del self.running[request]
                self.scanner.release(request)
                self.finished_at[request] = self.iteration
        self.peak_memory_side = max(self.peak_memory_side, self.committed(MEMORY))

    def run(self, limit: int = 200000) -> None:
        while self.scanner.pending() or self.running:
            self.step()
            assert self.iteration < limit


def two_sided(compute: int = 600, memory: int = 60) -> dict[int, Load]:
    """Short compute-heavy requests and long memory-heavy ones, lengths varied a little."""
    loads = {request: load(4.0 + request % 3, 1.0, steps=20 + request % 7, commit=30.0, prefill=40)
             for request in range(compute)}
    loads.update({request: load(0.2, 10.0 + request % 5, steps=400 + 37 * (request % 11), commit=300.0,
                                prefill=20, prompt=20)
                  for request in range(compute, compute + memory)})
    return loads


def test_blended_density_tracks_the_root_while_both_sides_hold_requests() -> None:
    loads = {request: load(4.0, 1.0) for request in range(300)}
    loads.update({request: load(0.1, 1.0) for request in range(300, 900)})
    scanner = scanner_for(loads, boundary=300, capacity=2000.0)
    root = sum(item.comp for item in loads.values()) / sum(item.mem for item in loads.values())
    running: list[int] = []
    checked = 0
    while scanner.pending():
        for request, side in scanner.propose(free=2000.0 - sum(scanner.used.values()), limit=1000):
            scanner.admit(request, side)
            running.append(request)
        sides = {scanner.side(request) for request in running}
        if sides == {COMPUTE, MEMORY}:
            weighted = sum(scanner.charged(r) * loads[r].comp / loads[r].mem for r in running)
            assert weighted / sum(scanner.charged(r) for r in running) == pytest.approx(root, rel=0.10)
            checked += 1
        for request in running[:20]:
            scanner.release(request)
        running = running[20:]
    assert checked > 5


def test_budgets_solve_algorithm_3_on_the_work_left() -> None:
    """``M_L rho_L + M_R rho_R = M rho_root`` with the densities of the sides' loads (which carry
    the compute left after prefix reuse: see the planner's ``reuse``)."""
    loads = {request: load(3.0, 1.0) for request in range(10)}
    loads.update({request: load(0.1, 1.0) for request in range(10, 20)})
    scanner = scanner_for(loads, boundary=10, capacity=1000.0)
    left, right = memory_partition(1000.0, (30.0 + 1.0) / 20.0, 3.0, 0.1)
    assert scanner.budgets()[COMPUTE] == pytest.approx(left)
    assert scanner.budgets()[MEMORY] == pytest.approx(right)


def test_one_side_empty_gives_the_other_all_memory() -> None:
    loads = {request: load(1.0, 1.0) for request in range(10)}
    scanner = scanner_for(loads, boundary=10, capacity=100.0)
    assert scanner.budgets() == {COMPUTE: 100.0, MEMORY: 0.0}
    proposal = scanner.propose(free=1e9, limit=100)
    assert [side for _request, side in proposal] == [COMPUTE] * 10


def test_equal_densities_split_memory_evenly() -> None:
    loads = {request: load(1.0, 1.0) for request in range(10)}
    scanner = scanner_for(loads, boundary=5, capacity=100.0)
    assert scanner.budgets() == {COMPUTE: 50.0, MEMORY: 50.0}


def test_each_side_waits_for_its_own_memory_and_early_finish_frees_it() -> None:
    loads = {request: load(4.0, 1.0) for request in range(50)}
    loads.update({request: load(0.25, 1.0) for request in range(50, 100)})
    scanner = scanner_for(loads, boundary=50, capacity=45.0)
    first = scanner.propose(free=45.0, limit=100)
    for request, side in first:
        scanner.admit(request, side)
    assert scanner.propose(free=45.0 - sum(scanner.used.values()), limit=100) == []
    finished = next(request for request, side in first if side == COMPUTE)
    scanner.release(finished)
    again = scanner.propose(free=45.0 - sum(scanner.used.values()), limit=100)
    assert again and all(side == COMPUTE for _request, side in again)


def test_underestimated_request_moves_to_the_memory_side() -> None:
    loads = {0: load(4.0, 1.0), 1: load(0.2, 1.0)}
    scanner = scanner_for(loads, boundary=1, capacity=100.0)
    for request, side in scanner.propose(free=1e9, limit=10):
        scanner.admit(request, side)
    scanner.move_to_memory_side(0, 30.0)
    assert scanner.side(0) == MEMORY
    assert scanner.used == {COMPUTE: 0.0, MEMORY: 40.0}


def test_preempted_request_is_offered_again_first() -> None:
    loads = {request: load(1.0, 1.0) for request in range(4)}
    scanner = scanner_for(loads, boundary=4, capacity=20.0)
    admitted = scanner.propose(free=1e9, limit=10)
    for request, side in admitted:
        scanner.admit(request, side)
    scanner.requeue(admitted[0][0])
    assert scanner.propose(free=1e9, limit=1)[0][0] == admitted[0][0]


def test_paced_memory_side_enters_staggered_not_as_a_cohort() -> None:
    loads = two_sided()
    scanner = scanner_for(loads, boundary=600, capacity=8000.0, paced=True)
    engine = TinyEngine(scanner, loads, capacity=8000.0)
    engine.run()
    starts = Counter(engine.admitted_at[r] for r in loads if r >= 600)
    share = scanner_for(loads, boundary=600, capacity=8000.0, paced=True).budgets()[MEMORY]
    at_once = share / 300.0
    # Unpaced, the share's worth of long requests would start in the first iteration; paced, the
    # prefill budget lets in a few an iteration even while the engine is filling.
    assert max(starts.values()) < at_once / 4
    assert len(starts) > 60 / 2


@pytest.mark.parametrize("paced", [False, True])
def test_a_side_over_its_share_goes_on_admitting_while_memory_is_free(paced: bool) -> None:
    """The shares decide which side the next slot goes to, never whether free memory is used:
    with the compute side over its share, the memory side is offered first (as far as its
    growth check lets it when paced), then the compute side goes on, until the free memory the
    engine reports is taken."""
    loads = {request: load(1.0, 1.0) for request in range(20)}
    scanner = scanner_for(loads, boundary=10, capacity=100.0, paced=paced)
    for request in scanner.order[:6]:
        scanner.admit(request, COMPUTE)
    assert scanner.used[COMPUTE] > scanner.budgets()[COMPUTE]
    proposal = scanner.propose(free=140.0, limit=100)
    assert proposal[0][1] == MEMORY
    assert {request for request, side in proposal if side == COMPUTE} == set(scanner.order[6:10])
    assert sum(loads[request].commit for request, _side in proposal) <= 140.0


def test_memory_side_never_grows_into_the_compute_share() -> None:
    loads = two_sided()
    scanner = scanner_for(loads, boundary=600, capacity=8000.0, paced=True)
    engine = TinyEngine(scanner, loads, capacity=8000.0)
    while scanner.pending():
        engine.step()
        share = scanner.budgets()[COMPUTE]
        if scanner.budgets()[MEMORY] > 0:
            assert engine.committed(MEMORY) <= 8000.0 - max(share, scanner.used[COMPUTE]) + 1e-6


def test_paced_shares_leave_headroom_and_an_idle_engine_may_always_start() -> None:
    loads = two_sided(compute=10, memory=10)
    scanner = scanner_for(loads, boundary=10, capacity=8000.0, paced=True)
    assert sum(scanner.budgets().values()) == pytest.approx(8000.0 * PLANNED_UTILISATION)
    scanner.credit = {COMPUTE: -1.0, MEMORY: -1.0}
    assert scanner.propose(free=1e9, limit=10)


def test_a_window_partitions_by_the_whole_plan_still_to_come() -> None:
    """A scheduler holding two requests of each side of a plan whose memory side has 38 more to
    come partitions as for 2 + 40: the window's own composition does not decide the blend."""
    loads = {request: load(3.0, 1.0) for request in range(2)}
    loads.update({request: load(0.1, 1.0) for request in range(2, 4)})
    order = [0, 1, 3, 2]
    window = DualScanner(order, 2, 1000.0, loads.__getitem__, beyond={MEMORY: 38})
    left, right = memory_partition(1000.0, (6.0 + 4.0) / 42.0, 3.0, 0.1)
    assert window.budgets()[COMPUTE] == pytest.approx(left)
    assert window.budgets()[MEMORY] == pytest.approx(right)
    assert window.budgets()[MEMORY] > DualScanner(order, 2, 1000.0, loads.__getitem__).budgets()[MEMORY]
    only_compute_here = DualScanner([0, 1], 2, 1000.0, loads.__getitem__, beyond={MEMORY: 5})
    assert only_compute_here.budgets() == {COMPUTE: 1000.0, MEMORY: 0.0}, \
        "with nothing of the memory side here yet, nothing stands for its requests to come"


def test_a_side_given_back_a_preempted_request_with_nothing_else_pending_admits_again() -> None:
    """The compute side's one request is preempted and admitted again with nothing else pending
    on its side; a new plan then brings that side more requests. It goes on admitting them while
    the memory side runs and memory is free (it once waited for an idle engine: the re-admission
    spaced its next spend by an infinite gap, which the next plan's scanner took over)."""
    loads = two_sided(compute=1, memory=40)
    scanner = scanner_for(loads, boundary=1, capacity=8000.0, paced=True)
    engine = TinyEngine(scanner, loads, capacity=8000.0)
    while 0 not in engine.running:
        engine.step()
    del engine.running[0]
    scanner.requeue(0)
    while 0 not in engine.running:
        engine.step()
    arrivals = {request: load(5.0, 1.0, steps=20, commit=30.0, prefill=40) for request in range(100, 140)}
    loads.update(arrivals)
    pending = [request for request in scanner.order if request not in engine.admitted_at]
    replanned = DualScanner(list(arrivals) + pending, len(arrivals), 8000.0, loads.__getitem__, paced=True)
    replanned.carry_over(scanner)
    engine.scanner = replanned
    for _ in range(200):
        engine.step()
    assert any(engine.scanner.side(request) == MEMORY for request in engine.running)
    # at its pace: a compute share this small admits one about every 25 iterations
    assert len(set(arrivals) & set(engine.admitted_at)) >= 4


def test_a_preempted_request_gives_its_side_back_what_its_admission_spent() -> None:
    """It pays again when it is admitted again; paying twice put a side preempted every few dozen
    iterations into a debt it never earned back, and it then admitted only on an idle engine."""
    loads = two_sided(compute=10, memory=10)
    scanner = scanner_for(loads, boundary=10, capacity=8000.0, paced=True)
    request, side = scanner.propose(free=1e9, limit=1)[0]
    before = scanner.credit[side]
    scanner.admit(request, side)
    assert scanner.credit[side] < before
    scanner.requeue(request)
    assert scanner.credit[side] == pytest.approx(before)


def test_the_commitment_bound_never_falls_below_the_peak() -> None:
    """The growth check trusts the bound when it fits, so it must never understate the peak."""
    rng = random.Random(0)
    for _ in range(200):
        tracks = [(Load(comp=1.0, mem=1.0, prefill=1, steps=rng.randrange(1, 900), commit=1.0,
                        prompt=50, unshared_prompt=rng.randrange(0, 200), max_new_tokens=rng.randrange(900, 6000),
                        exact=rng.random() < 0.5), rng.randrange(0, 900)) for _ in range(rng.randrange(1, 12))]
        assert commitment_bound(tracks) >= peak_commitment(tracks) - 1e-6
        assert commitment_bound(tracks[:1]) == pytest.approx(peak_commitment(tracks[:1]))
        fresh = [(track_load, 0) for track_load, _decoded in tracks]
        lasts = sum(track_load.last_commitment() for track_load, _zero in fresh)
        assert lasts == pytest.approx(commitment_bound(fresh))
