"""The dual scanner (paper §4.4, Algorithm 3) with runtime adaptation.

A plan's order runs from compute-heavy to memory-heavy. One cursor walks the compute side from
the left, the other the memory side from the right (both in DFS order, so each keeps prefix
sharing), and KV memory is partitioned so that the two sides together hold work at the root's
density: ``M_L rho_L + M_R rho_R = M rho_root`` (step 1). Each side's share then fixes how many
of its requests decode at once, ``N = M_side / (p + d/2)``, and how fast they must be replaced,
``C = N p / d`` prefill tokens per iteration (steps 2-3).

What makes that hold in a running engine rather than only on paper:

- Densities are of the work still to do -- pending requests and what running ones have left --
  with the compute a request saves by reusing its neighbour's prefix taken off (the paper's
  ``(1 - s) T_comp``). The partition then gives each side memory in proportion to its remaining
  memory work, so both sides run out together instead of one finishing early and leaving the
  other to run alone.
- Each side is paced (``paced=True``): it earns credit every iteration at its Alg. 3 rate and
  spends it on admissions, so its requests enter staggered as memory frees. Filling a whole share
  at once would start its requests in lockstep: their KV would grow together to twice the
  planned average and free together, and the batch would swing between compute-only and
  memory-only.
- The shares and the pace decide the blend -- which side the next slot goes to -- never the
  size of the batch: once they stop, a proposal goes on while the engine has free KV and request
  slots (`DualScanner._fill`), and an engine holding less than its capacity gets the prefill to
  take them up (`DualScanner.prefill_budget`). Small decode batches are weight-bound.
- Shares are counted in what the engine's admission counts (`Load.commit`), which for a long
  ``ignore_eos`` output includes the decode room SGLang reserves for it. A memory-side
  request is admitted only if the side's requests, growing as they decode, never need more than
  the side's share (`peak_commitment`): its share holds on average, and without that check the
  oldest, longest requests could outgrow it and take the room the compute side was promised.

A side with nothing left to do cedes its memory; a request that outgrows its estimate on the
compute side is moved to the memory side's account.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sgl_blend.core.cost_model import memory_partition
from sgl_blend.core.scan_load import Load, LoadTotals, commitment_bound, peak_commitment

COMPUTE = "compute"
MEMORY = "memory"
SIDES = (COMPUTE, MEMORY)
# Credit a side may bank while it cannot admit (its share is full, or the engine's memory is):
# at least this many iterations' worth, or one lifetime of its mean request, so a side kept from
# admitting by its requests' growth makes the admissions up later and keeps pace with the other side.
BANKED_ITERATIONS = 256
# Making up is spread out: a side spends credit at most this many times as fast as it earns it,
# so requests that had to wait never start together and then grow and finish in lockstep.
CATCH_UP = 2.0
# How often (in iterations) what running requests have left is re-estimated for the partition.
REFRESH_ITERATIONS = 32
# The part of KV memory the partition plans to fill. Shares are met on average; the rest absorbs
# what the averages miss -- a side's requests growing older together, shared prefixes in the
# cache, the full decode room a new request reserves on admission -- so that the memory side's
# growth check (which may use all of it) seldom has to defer admissions.
PLANNED_UTILISATION = 0.9
# An engine holding less than its capacity gets the prefill that refills the gap within this many
# mean request lifetimes (`DualScanner.prefill_budget`). Simulated H100, trace1-4 at 4,000 lines,
# BlendServe's job seconds summed over the four: 416.5 without the refill, 407.9 at 1 lifetime,
# 405.8 at 0.5, 406.5 at 0.25, 407.1 at 0.125; 0.5 is the only one slower than none on no trace.
REFILL_LIFETIMES = 0.5


@dataclass(eq=False, slots=True)
class ScanEntry:
    """One request as a scanner tracks it: where its plan put it, and, while it runs, the side it
    counts against and what it is charged there.

    Its place in the plan and its running state are separate fields: a request admitted under one
    plan runs on under the next (`DualScanner.carry_over`) with no place in that plan's order, and
    a requeued one goes to its side's retry queue, not back into the order."""

    load: Load
    """Its load: as this plan priced it, for a request in the order; as priced when it was
    admitted, for one that is not."""
    region: str | None = None
    """The side of this scanner's order it lies on; None if it is not in the order."""
    taken: bool = False
    """It has left the order: admitted or withdrawn."""
    running: bool = False
    """Admitted, and not yet finished, preempted or withdrawn."""
    side: str = MEMORY
    """While it runs, the side it counts against."""
    charged: float = 0.0
    """While it runs, the KV tokens charged against that side's share."""
    started: int = 0
    """The scanner's clock when it was admitted."""
    decoded: int = 0
    """Tokens decoded, as last reported."""
    left: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """(compute, memory, KV-token-iterations) it had left at the last refresh."""

    def start(self, side: str, load: Load, clock: int) -> None:
        """Admitted now, to ``side``: charged what its load commits."""
        self.running, self.side, self.charged, self.load = True, side, load.commit, load
        self.started, self.decoded, self.left = clock, 0, load.left_after(0)

    def run_on(self, earlier: ScanEntry) -> None:
        """Run on as ``earlier`` (the same request under an earlier plan's scanner) was running."""
        self.running, self.side, self.charged, self.load = True, earlier.side, earlier.charged, earlier.load
        self.started, self.decoded, self.left = earlier.started, earlier.decoded, earlier.left


@dataclass(slots=True)
class _Draft:
    """A proposal being drawn up: what it has chosen, and the free KV, shares used, credit and
    pace it leaves, none of which the scanner takes until the engine admits the requests. Each
    side's pending requests are read once, in scan order (``queues``), however many the proposal
    weighs."""

    free: float
    used: dict[str, float]
    credit: dict[str, float]
    next_spend: dict[str, float]
    queues: dict[str, Iterator[int]]
    heads: dict[str, int | None] = field(default_factory=dict)
    chosen: list[tuple[int, str]] = field(default_factory=list)
    memory_loads: list[Load] = field(default_factory=list)
    """The loads of the memory-side requests chosen."""
    memory_bound: float = 0.0
    """What they commit at most (`Load.last_commitment`), summed."""

    def head(self, side: str) -> int | None:
        """The side's next request not yet chosen."""
        if side not in self.heads:
            self.heads[side] = next(self.queues[side], None)
        return self.heads[side]

    def take(self, side: str, load: Load) -> None:
        """Choose the side's head, whose load is ``load``."""
        head = self.heads.pop(side)
        assert head is not None, "a side is taken from only when its head was peeked"
        self.chosen.append((head, side))
        self.used[side] += load.commit
        self.free -= load.commit
        if side == MEMORY:
            self.memory_loads.append(load)
            self.memory_bound += load.last_commitment()


class DualScanner:
    """Scans one plan. Loads come from a callback so estimates can change between plans.

    The scanner keeps one `ScanEntry` per request of its order and per request it runs; the
    running requests, each side's retry queue and the order refer to those.

    ``beyond`` counts, per side, the requests of a plan made outside the engine that are still to
    come: the scheduler holds only a window of that plan, and a partition of the work in the
    window alone would serve whichever side the window happens to hold most of. Those requests are
    taken to be like the side's pending ones, so a side's work left is its pending work scaled to
    its whole remaining count (`Placement.after` of its front request says how many follow it).

    ``paced`` turns on per-side credit (`advance` pays it out) and the memory side's growth
    check; without it a side admits whenever its share has room, which is how the single-cursor
    policies use the scanner.
    """

    def __init__(
        self,
        order: list[int],
        boundary: int,
        capacity: float,
        load: Callable[[int], Load],
        *,
        paced: bool = False,
        beyond: dict[str, int] | None = None,
    ) -> None:
        self.order = order
        self.boundary = boundary
        self.capacity = capacity
        self.paced = paced
        self.beyond = beyond or {}
        self._load = load
        self._version = 0
        self._reports = 0
        self._derived: tuple[tuple[int, float], tuple] | None = None
        self._tracks_cache: dict[str, tuple[tuple[int, int, int], tuple[list[tuple[Load, int]], float]]] = {}
        self._left = 0
        self._right = len(order) - 1
        self._taken = 0
        self._entries: dict[int, ScanEntry] = {}
        self._retry: dict[str, list[int]] = {COMPUTE: [], MEMORY: []}
        self._running: dict[int, ScanEntry] = {}
        self.used = {COMPUTE: 0.0, MEMORY: 0.0}
        self.credit = {COMPUTE: 0.0, MEMORY: 0.0}
        self._next_spend = {COMPUTE: 0.0, MEMORY: 0.0}
        self.clock = 0
        self._refreshed = 0
        self._left_running = {COMPUTE: [0.0, 0.0, 0.0], MEMORY: [0.0, 0.0, 0.0]}
        self._remaining = {COMPUTE: LoadTotals(), MEMORY: LoadTotals()}
        for index, request in enumerate(order):
            side = COMPUTE if index < boundary else MEMORY
            entry = self._entries[request] = ScanEntry(load(request), region=side)
            self._remaining[side].add(entry.load)
        if paced:
            self.credit = dict(self._earning())

    def _entry(self, request: int, load: Load) -> ScanEntry:
        """The request's entry; one not in the order gets an entry while it runs."""
        entry = self._entries.get(request)
        if entry is None:
            entry = self._entries[request] = ScanEntry(load)
        return entry

    def side(self, request: int) -> str | None:
        """The side a running request counts against, or None if it is not running."""
        run = self._running.get(request)
        return run.side if run is not None else None

    def charged(self, request: int) -> float:
        """KV tokens a running request is charged against its side's share."""
        return self._running[request].charged

    def carry_over(self, previous: DualScanner) -> None:
        """Take over what an earlier plan's scanner has running, its clock and its credit. (A
        running request is in no later order: a plan orders pending requests only.)"""
        self._changed()
        self.clock = self._refreshed = previous.clock
        for request, earlier in previous._running.items():
            run = self._running[request] = self._entry(request, earlier.load)
            run.run_on(earlier)
            self.used[run.side] += run.charged
            self._add_left(run, +1)
        if self.paced and previous.paced:
            self.credit = dict(previous.credit)
            self._next_spend = dict(previous._next_spend)

    # -- the partition (Alg. 3, steps 1-3) ------------------------------------------------------

    def _work(self, side: str) -> tuple[float, float, float]:
        """(compute, memory, KV-token-iterations) a side has left: pending -- with the requests
        still to come (`beyond`), at the pending ones' mean -- plus running."""
        pending, running = self._remaining[side], self._left_running[side]
        scale = 1.0 + self.beyond.get(side, 0) / pending.count if pending.count > 0 else 1.0
        return (
            pending.comp * scale + running[0],
            pending.mem * scale + running[1],
            pending.kv_steps * scale + running[2],
        )

    def _changed(self) -> None:
        self._version += 1

    def _partition(self) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """Budgets, rates and earnings, recomputed only when the scanner's state has changed: an
        engine asks for them several times an iteration."""
        key = (self._version, self.capacity)
        if self._derived is None or self._derived[0] != key:
            budgets = self._budgets()
            rates = self._rates(budgets)
            self._derived = (key, (budgets, rates, self._earnings(rates)))
        return self._derived[1]

    def budgets(self) -> dict[str, float]:
        return dict(self._partition()[0])

    def rates(self) -> dict[str, float]:
        return dict(self._partition()[1])

    def _earning(self) -> dict[str, float]:
        return self._partition()[2]

    def _budgets(self) -> dict[str, float]:
        """``M_L`` and ``M_R`` (Alg. 3, step 1) for the work left, in the engine's KV tokens.

        The partition is solved on KV traffic, where the paper states it, then each side's
        traffic is converted to what its requests commit in the engine per unit of traffic. A
        side keeps its share while its running requests still have work, even with nothing left
        to admit: the other side then spreads what it has left over that tail instead of rushing
        through it and leaving the tail to run alone. A side with no work left cedes its share."""
        total = self.capacity * (PLANNED_UTILISATION if self.paced else 1.0)
        work = {side: tuple(max(amount, 0.0) for amount in self._work(side)) for side in SIDES}
        active = {
            side: self._has_pending(side) or self.beyond.get(side, 0) > 0 or (self.paced and self._running_on(side))
            for side in SIDES
        }
        for side, other in ((COMPUTE, MEMORY), (MEMORY, COMPUTE)):
            if not active[other] or min(work[other][1:]) <= 0:
                return {side: total, other: 0.0}
        (left_comp, left_mem, left_kv), (right_comp, right_mem, right_kv) = work[COMPUTE], work[MEMORY]
        rho_root = (left_comp + right_comp) / (left_mem + right_mem)
        traffic_left, traffic_right = memory_partition(1.0, rho_root, left_comp / left_mem, right_comp / right_mem)
        commit_left = traffic_left * left_kv / left_mem
        commit_right = traffic_right * right_kv / right_mem
        scale = total / (commit_left + commit_right)
        return {COMPUTE: commit_left * scale, MEMORY: commit_right * scale}

    def _rates(self, budgets: dict[str, float]) -> dict[str, float]:
        """Admissions per iteration that keep each side's share full in steady state: a share
        ``M`` holds ``M / commit`` requests, each for ``steps`` iterations (Alg. 3, step 2)."""
        rates = {}
        for side in SIDES:
            totals = self._remaining[side]
            rates[side] = budgets[side] * totals.count / totals.kv_steps if totals.kv_steps > 0 else 0.0
        return rates

    def prefill_budget(self) -> float | None:
        """Prefill tokens per iteration, ``C_L + C_R`` (Alg. 3, step 3): each side's admission
        rate times its mean prefill. Spreading prefill this thinly is what lets every iteration
        overlap compute with memory instead of alternating between them.

        The rates keep full shares full; an engine holding less than its capacity (at the start,
        or after a side ran dry) also gets the prefill that refills the gap within
        `REFILL_LIFETIMES` of a mean request's life, so the fill (`_fill`) can take it up."""
        budgets, rates, _earnings = self._partition()
        budget = sum(
            rates[side] * self._remaining[side].prefill / self._remaining[side].count
            for side in SIDES
            if self._remaining[side].count
        )
        shares = sum(budgets.values())
        if budget and shares > 0:
            gap = max(self.capacity - sum(self.used.values()), 0.0)
            budget *= 1.0 + gap / (REFILL_LIFETIMES * shares)
        return budget or None

    def _earnings(self, rates: dict[str, float]) -> dict[str, float]:
        """Credit per iteration: a side's admission rate times the mean of what it is paced in --
        compute for the compute side, KV traffic for the memory side -- so the compute per
        iteration stays level whatever the prompt lengths, and so does the memory however long
        the outputs."""
        earning = {}
        for side in SIDES:
            totals = self._remaining[side]
            amount = totals.comp if side == COMPUTE else totals.mem
            earning[side] = rates[side] * amount / totals.count if totals.count else 0.0
        return earning

    def _load_of(self, request: int) -> Load:
        """Its load as this plan priced it, or, for a request not in the order, priced now."""
        entry = self._entries.get(request)
        return entry.load if entry is not None and entry.region is not None else self._load(request)

    def _price(self, side: str, request: int) -> float:
        load = self._load_of(request)
        return load.comp if side == COMPUTE else load.mem

    def advance(self, iterations: int) -> None:
        """The engine ran ``iterations`` more iterations: pay each side its credit for them."""
        if iterations <= 0:
            return
        self.clock += iterations
        if self.clock - self._refreshed >= REFRESH_ITERATIONS:
            self._refresh_left()
        if self.paced:
            for side, earning in self._earning().items():
                self.credit[side] = min(self.credit[side] + earning * iterations, self._bank_limit(side))

    def _bank_limit(self, side: str) -> float:
        """The most credit a side may bank (`BANKED_ITERATIONS`)."""
        totals = self._remaining[side]
        lifetime = totals.steps / totals.count if totals.count else 0.0
        return self._earning()[side] * max(BANKED_ITERATIONS, lifetime)

    # -- running requests ------------------------------------------------------------------------

    def _decoded(self, run: ScanEntry) -> int:
        """Tokens a running request has decoded: its last report, or, if the clock says more,
        one per iteration since admission (never less than it really has, so the growth check
        errs on the safe side)."""
        return max(run.decoded, min(self.clock - run.started, max(run.load.steps, run.decoded)))

    def _add_left(self, run: ScanEntry, sign: int) -> None:
        totals = self._left_running[run.side]
        for position, amount in enumerate(run.left):
            totals[position] += sign * amount

    def _refresh_left(self) -> None:
        self._changed()
        self._refreshed = self.clock
        self._left_running = {COMPUTE: [0.0, 0.0, 0.0], MEMORY: [0.0, 0.0, 0.0]}
        for run in self._running.values():
            run.left = run.load.left_after(self._decoded(run))
            self._add_left(run, +1)

    def progress(self, request: int, decoded: int) -> None:
        run = self._running.get(request)
        if run is not None and decoded > run.decoded:
            run.decoded = decoded
            self._reports += 1

    def _running_tracks(self, side: str) -> tuple[list[tuple[Load, int]], float]:
        """The side's running requests as ``(load, decoded)``, and the bound on their peak
        (`commitment_bound`), kept while nothing they depend on changes: a proposal asks for
        them once per request it weighs."""
        key = (self._version, self._reports, self.clock)
        cached = self._tracks_cache.get(side)
        if cached is None or cached[0] != key:
            tracks = [(run.load, self._decoded(run)) for run in self._running.values() if run.side == side]
            cached = self._tracks_cache[side] = (key, (tracks, commitment_bound(tracks)))
        return cached[1]

    def peak_commitment(self, side: str, extra: tuple[Load, ...] = ()) -> float:
        """The most KV the engine will count against a side's running requests (and ``extra``,
        started now) as they decode on to their estimated lengths (see `peak_commitment`)."""
        tracks, _bound = self._running_tracks(side)
        return peak_commitment(tracks + [(load, 0) for load in extra])

    def _memory_grows_within(self, draft: _Draft, load: Load, room: float) -> bool:
        """Whether the memory side's running requests, those the draft chose and ``load`` never
        need more than ``room``. The cheap bound settles most cases; a fill weighs dozens of
        requests a proposal, and the exact peak for each took most of the simulator's time."""
        _tracks, bound = self._running_tracks(MEMORY)
        if bound + draft.memory_bound + load.last_commitment() <= room:
            return True
        return self.peak_commitment(MEMORY, (*draft.memory_loads, load)) <= room

    # -- proposing and admitting -----------------------------------------------------------------

    def _has_pending(self, side: str) -> bool:
        return next(self._candidates(side), None) is not None

    def _candidates(self, side: str) -> Iterator[int]:
        """A side's pending requests in scan order: its retry queue, then its part of the order
        from its cursor."""
        yield from self._retry[side]
        if side == COMPUTE:
            indices = range(self._left, min(self.boundary, self._right + 1))
        else:
            indices = range(self._right, max(self.boundary, self._left) - 1, -1)
        for index in indices:
            request = self.order[index]
            if not self._entries[request].taken:
                yield request

    def _advance_cursors(self) -> None:
        while self._left < len(self.order) and self._entries[self.order[self._left]].taken:
            self._left += 1
        while self._right >= 0 and self._entries[self.order[self._right]].taken:
            self._right -= 1

    def _spend_after(self, side: str, start: float, request: int, earning: float) -> float:
        """When a side may spend again after spending on ``request`` from ``start``: its price
        takes ``price / (CATCH_UP * earning)`` iterations to pay at the catch-up rate. A side that
        earns nothing has nothing left to space out (its last pending request was just taken):
        it may spend again at once, and its credit alone holds it back. Spacing it by an infinite
        gap kept it from admitting ever after, across plans, as requests came back to it."""
        if earning <= 0:
            return max(start, self.clock)
        return max(start, self.clock) + self._price(side, request) / (CATCH_UP * earning)

    def _fits(self, side: str, request: int, draft: _Draft, budgets: dict[str, float]) -> bool:
        """Within the side's share. A paced side is kept to its share on average by its pacing,
        so the hard limits only guard what pacing cannot: the memory side's requests -- running,
        and proposed before this one -- may grow into all the memory the compute side's share
        does not need, never into that share; the compute side's requests live a few dozen
        iterations, so a share of a few dozen requests would stall it whenever some long prompts
        arrive together, and only the engine's free memory limits it."""
        if self.paced and side == MEMORY:
            room = self.capacity - max(budgets[COMPUTE], draft.used[COMPUTE])
            load = self._load_of(request)
            return (not self._running_on(MEMORY) and not draft.memory_loads) or self._memory_grows_within(
                draft, load, room
            )
        if self.paced:
            return True
        used = draft.used[side]
        return used + self._commit(request) <= budgets[side] or (used == 0 and budgets[side] > 0)

    def _running_on(self, side: str) -> bool:
        return bool(self._running_tracks(side)[0])

    def propose(self, free: float, limit: int) -> list[tuple[int, str]]:
        """Requests to admit now and the side each counts against: first the blend (`_blend`),
        then, while ``free`` and ``limit`` last, the fill (`_fill`)."""
        draft = _Draft(
            free,
            dict(self.used),
            dict(self.credit),
            dict(self._next_spend),
            {side: self._candidates(side) for side in SIDES},
        )
        budgets = self.budgets()
        self._blend(draft, limit, budgets)
        self._fill(draft, limit, budgets)
        return draft.chosen

    def _blend(self, draft: _Draft, limit: int, budgets: dict[str, float]) -> None:
        """Alternate toward the side with the most unused share until both sides are out of
        share, credit (a paced side) or ``free``."""
        earning = self._earning() if self.paced else {}
        blocked: set[str] = set()
        while len(draft.chosen) < limit and len(blocked) < 2:
            side = max((side for side in SIDES if side not in blocked), key=lambda s: budgets[s] - draft.used[s])
            request = draft.head(side)
            if request is None or (self.paced and (draft.credit[side] <= 0 or draft.next_spend[side] > self.clock + 1)):
                blocked.add(side)
                continue
            if self._commit(request) > draft.free or not self._fits(side, request, draft, budgets):
                blocked.add(side)
                continue
            draft.take(side, self._load_of(request))
            if self.paced:
                draft.credit[side] -= self._price(side, request)
                draft.next_spend[side] = self._spend_after(side, draft.next_spend[side], request, earning[side])

    def _fill(self, draft: _Draft, limit: int, budgets: dict[str, float]) -> None:
        """Go on admitting while the engine has free KV and request slots: the shares decide the
        blend -- the side furthest under its share goes first, so the other side when one is over
        -- never the batch. A paced memory side still never grows into the compute side's share
        (`_fits`): its requests live long, and the compute side's short ones free their memory
        soon. A blend that stopped at a side's share or pace left the engine underfull: on the
        emulated H100 BlendServe's median decode batch held 127 requests while 190 waited, where
        SGLang's own orders held about 250 (issue 27), and small decode batches are weight-bound."""
        blocked: set[str] = set()
        while len(draft.chosen) < limit and len(blocked) < 2:
            side = max((side for side in SIDES if side not in blocked), key=lambda s: budgets[s] - draft.used[s])
            request = draft.head(side)
            if (
                request is None
                or self._commit(request) > draft.free
                or (self.paced and side == MEMORY and not self._fits(side, request, draft, budgets))
            ):
                blocked.add(side)
                continue
            draft.take(side, self._load_of(request))

    def _commit(self, request: int) -> float:
        return self._load_of(request).commit

    def admit(self, request: int, side: str) -> None:
        self._changed()
        load = self._load_of(request)
        if request in self._retry[side]:
            self._retry[side].remove(request)
            self._remaining[side].add(load, -1)
        run = self._running[request] = self._entry(request, load)
        run.start(side, load, self.clock)
        self.used[side] += run.charged
        self._add_left(run, +1)
        if self.paced:
            self.credit[side] -= self._price(side, request)
            self._next_spend[side] = self._spend_after(side, self._next_spend[side], request, self._earning()[side])
        self._take(request)

    def _take(self, request: int) -> None:
        """Mark a request of this plan's order as no longer pending (requests admitted under an
        earlier plan and requeued here are not in the order and need no bookkeeping)."""
        entry = self._entries.get(request)
        if entry is None or entry.region is None or entry.taken:
            return
        self._changed()
        entry.taken = True
        self._taken += 1
        self._remaining[entry.region].add(entry.load, -1)
        self._advance_cursors()

    def release(self, request: int) -> None:
        """A running request finished: its memory goes back to its side."""
        run = self._running.pop(request, None)
        if run is not None:
            self._changed()
            self.used[run.side] -= run.charged
            self._add_left(run, -1)
            run.running = False
            if run.region is None:
                del self._entries[request]

    def requeue(self, request: int) -> None:
        """A running request was preempted: free its share and offer it again first."""
        entry = self._entries.get(request)
        if entry is not None and entry.running:
            side = entry.side
            if self.paced:
                self._refund(side, request)
        else:  # not running here: back to the side its plan gave it
            side = entry.region if entry is not None and entry.region is not None else MEMORY
        self.release(request)
        self._changed()
        self._retry[side].append(request)
        self._remaining[side].add(self._load_of(request))

    def _refund(self, side: str, request: int) -> None:
        """Give back what a preempted request's admission spent: it is admitted, and paid for,
        again when it returns. Without the refund each preemption charged its side twice, and a
        side preempted every few dozen iterations sank into debt and admitted only when the
        engine was idle."""
        self.credit[side] = min(
            self.credit[side] + self._price(side, request), max(self.credit[side], self._bank_limit(side))
        )

    def withdraw(self, request: int) -> None:
        self._changed()
        for side, queue in self._retry.items():
            if request in queue:
                queue.remove(request)
                self._remaining[side].add(self._load_of(request), -1)
        self.release(request)
        self._take(request)

    def move_to_memory_side(self, request: int, new_footprint: float) -> None:
        """Runtime adaptation: an under-estimated request now takes more KV than planned and
        behaves like memory-side work, so it is accounted there."""
        run = self._running.get(request)
        if run is None:
            return
        self._changed()
        self.used[run.side] -= run.charged
        self._add_left(run, -1)
        run.side = MEMORY
        run.charged = new_footprint
        self.used[MEMORY] += new_footprint
        self._add_left(run, +1)

    def pending(self) -> int:
        return len(self.order) - self._taken + sum(len(queue) for queue in self._retry.values())
