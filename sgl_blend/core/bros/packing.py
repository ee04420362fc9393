"""Alg. 1 of BROS: priority-based packing of real-time (RT) and best-effort (BE) requests.

Each iteration the running set is rebuilt from scratch:

1. RT requests, most urgent first (`urgency`), join while the batch size allows, KV room exists
   (free slots, or BE slots an RT request may take: `FindPreemptBlock`) and the predicted
   iteration time stays within the budget -- the smallest residual time among RT requests that
   can still meet their deadline.
2. BE requests, fewest checkpointed tokens first (least swap time), join while the batch size,
   free slots (`FindBlock`: BE requests never take slots) and the budget allow; one that does not
   fit may replace the least urgent RT request instead. That RT request goes back to the head
   of its queue. A BE prompt that fits neither way gets the longest prefill chunk the residual
   budget allows (as SGLang chunks a prompt, one chunked request per iteration), and the pass
   ends there.

Guards where the paper is silent (systems.md: "guard the empty/infeasible cases"):

- No RT request (or none that can still make its deadline): no deadline bounds the batch; only
  batch size, memory and the SLO's ``idle_s`` cap (unbounded unless set) do.
- Infeasible head: an RT request whose residual is below the time of an iteration holding it
  alone will miss whatever happens; it keeps its place in the order but does not set the
  budget (otherwise one late request would shrink every batch to nothing). Its presence counts as
  a violation for the adaptive batch size.
- Empty batch: the most urgent RT request always runs, even alone over budget, since an idle
  iteration only brings every deadline closer; with no RT request to run, the first BE request
  runs a chunk sized to the idle cap (at least `MIN_CHUNK` tokens), so a long prompt neither
  waits forever nor holds an RT arrival past the cap.
- Replacement keeps the formulation's constraint (6): the displaced RT request must still meet
  its deadline if it runs in the next iteration (residual ≥ this batch + the average iteration).

Requests left out keep their KV where it is; nothing is retracted here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sgl_blend.core.bros.batch_size import AdaptiveBatchSize, Pressure
from sgl_blend.core.bros.cost import IterationCost
from sgl_blend.core.bros.requests import SLO, BrosRequest
from sgl_blend.core.bros.urgency import MergedCursor, RealtimeQueues
from sgl_blend.core.iteration_budget import DEFAULT_MIN_OFFLINE_CHUNK
from sgl_blend.core.latency_model import BatchShape

AVERAGE_WEIGHT = 0.2
# The shortest prefill chunk a BE prompt is given (the co-location planner's minimal offline chunk).
MIN_CHUNK = DEFAULT_MIN_OFFLINE_CHUNK
FIT_SLACK_S = 1e-12


@dataclass(frozen=True)
class MemoryState:
    """What Alg. 1 reads of the KV manager: free device slots an RT request can claim, those a
    BE request can claim (None: the same), and per BE request the device slots it holds, which
    an RT request may take when it is not in the batch. ``own_room`` is the free room in each
    request's last block, which only that request grows into."""

    free_slots: int
    best_effort_resident: Mapping[str, int] = field(default_factory=dict)
    best_effort_free: int | None = None
    own_room: Mapping[str, int] = field(default_factory=dict)


class _Ledger:
    """KV slots claimed by the batch under construction: RT requests use free slots first and
    then slots of BE requests outside the batch; BE requests only use free slots."""

    def __init__(self, memory: MemoryState) -> None:
        self.free = memory.free_slots
        self.best_effort_free = memory.free_slots if memory.best_effort_free is None else memory.best_effort_free
        self.resident = memory.best_effort_resident
        self.own_room = memory.own_room
        self.takeable = sum(memory.best_effort_resident.values())
        self.realtime = 0
        self.best_effort = 0

    def fits(self, realtime: int, best_effort: int, takeable: int) -> bool:
        return best_effort <= self.best_effort_free and realtime + best_effort <= self.free + takeable

    def need(self, request: BrosRequest) -> int:
        return max(request.new_slots() - self.own_room.get(request.rid, 0), 0)

    def fits_realtime(self, request: BrosRequest) -> bool:
        return self.fits(self.realtime + self.need(request), self.best_effort, self.takeable)

    def fits_best_effort(self, request: BrosRequest) -> bool:
        return self.fits(
            self.realtime, self.best_effort + self.need(request), self.takeable - self.resident.get(request.rid, 0)
        )


@dataclass
class BrosPlan:
    realtime: list[BrosRequest]
    best_effort: list[BrosRequest]
    budget_s: float
    predicted_s: float
    swap_tokens: int
    batch_size: int
    pressure: Pressure
    late: int = 0
    replaced: int = 0
    realtime_queued: int = 0
    margin_s: float = 0.0  # of predicted_s, the tail's (`cost.PeriodTail`)

    @property
    def requests(self) -> list[BrosRequest]:
        return [*self.realtime, *self.best_effort]

    def summary(self) -> dict[str, object]:
        return {
            "realtime": len(self.realtime),
            "best_effort": len(self.best_effort),
            "budget_s": None if math.isinf(self.budget_s) else round(self.budget_s, 6),
            "predicted_s": round(self.predicted_s, 6),
            "margin_s": round(self.margin_s, 6),
            "swap_tokens": self.swap_tokens,
            "batch_size": self.batch_size,
            "pressure": self.pressure.value,
            "late": self.late,
            "replaced": self.replaced,
            "realtime_queued": self.realtime_queued,
        }


class _Batch:
    """The batch under construction. Its shape is kept as running sums, so each candidate costs
    one prediction and no copy of the batch."""

    def __init__(self, cost: IterationCost) -> None:
        self.cost = cost
        self.realtime: list[BrosRequest] = []
        self.best_effort: list[BrosRequest] = []
        self.sums = [0, 0, 0, 0, 0]
        self.longest = 0
        self.swap = 0

    def __len__(self) -> int:
        return len(self.realtime) + len(self.best_effort)

    def time_with(self, request: BrosRequest | None = None, without: BrosRequest | None = None) -> float:
        sums, swap = list(self.sums), self.swap
        for member, sign in ((request, 1), (without, -1)):
            if member is not None:
                for index, value in enumerate(_step_sums(member)):
                    sums[index] += sign * value
                swap += sign * member.host_tokens
        longest = max(self.longest, _step_sums(request)[4] if request is not None else 0)
        prefill_tokens, prefill_reqs, prefill_attention, decode_reqs, decode_context = sums
        shape = BatchShape(prefill_tokens, prefill_reqs, prefill_attention, decode_reqs, decode_context, longest)
        return self.cost.predict(shape, swap)

    def add(self, request: BrosRequest) -> None:
        (self.realtime if request.realtime else self.best_effort).append(request)
        self._count(request, 1)

    def drop_last_realtime(self) -> BrosRequest:
        request = self.realtime.pop()
        self._count(request, -1)
        return request

    def _count(self, request: BrosRequest, sign: int) -> None:
        if sign > 0:
            self.longest = max(self.longest, _step_sums(request)[4])
        for index, value in enumerate(_step_sums(request)):
            self.sums[index] += sign * value
        self.swap += sign * request.host_tokens


def _step_sums(request: BrosRequest) -> tuple[int, int, int, int, int]:
    """What a request's step adds to `BatchShape`'s prefill tokens, prefill requests, prefill
    attention, decode requests and decode context. The longest decode context is a running
    maximum that a removed request does not lower (an upper bound, for Echo's form only)."""
    if request.is_prefill():
        extend = request.extend_tokens()
        return extend, 1, extend * (request.prefix_tokens() + extend), 0, 0
    return 0, 0, 0, 1, request.prompt_len + request.generated


def _swap_order(request: BrosRequest) -> tuple[bool, bool, int, int]:
    """BE packing order: started requests by checkpointed tokens (their swap cost), then a prompt
    part-way through its chunks (it holds KV already), then new ones, oldest first. A new request
    has nothing to swap, but starting it while started ones wait for their checkpointed tokens
    would fill the room they need to come back."""
    return not request.prefilled, request.prompt_done == 0, request.host_tokens, request.seq


class BrosScheduler:
    def __init__(self, cost: IterationCost, slo: SLO, batch_size: AdaptiveBatchSize) -> None:
        self.cost = cost
        self.slo = slo
        self.batch_size = batch_size
        self.realtime = RealtimeQueues(slo)
        self.best_effort: dict[str, BrosRequest] = {}
        self.average_iteration_s = 0.0
        self._seq = 0

    def submit(self, request: BrosRequest) -> None:
        if request.realtime:
            self.realtime.arrive(request)
            return
        if request.rid in self.best_effort:
            raise ValueError(f"best-effort request {request.rid!r} is already queued")
        self._seq += 1
        request.seq = self._seq
        self.best_effort[request.rid] = request

    def remove(self, request: BrosRequest) -> None:
        if request.realtime:
            self.realtime.remove(request)
        else:
            self.best_effort.pop(request.rid, None)

    def solo_time(self, request: BrosRequest) -> float:
        return self.cost.predict(request.add_to(BatchShape()), request.host_tokens)

    def budget(self, now: float) -> tuple[float, int]:
        """The smallest residual among RT requests that can still make their deadline (the idle
        cap when none can), and how many more urgent ones cannot."""
        late = 0
        for request in self.realtime.in_order():
            residual = request.residual(now, self.slo)
            if residual >= self.solo_time(request):
                return residual, late
            late += 1
        return self.slo.idle_s, late

    def plan(self, now: float, memory: MemoryState) -> BrosPlan:
        """Choose this iteration's batch; the chosen RT requests leave their queues until
        `finish` puts them back."""
        budget, late = self.budget(now)
        queued = len(self.realtime)
        limit = self.batch_size.current
        ledger = _Ledger(memory)
        batch = _Batch(self.cost)
        cursor = self.realtime.cursor()
        pressure = self._pack_realtime(cursor, batch, ledger, budget, limit)
        if late:
            pressure = Pressure.VIOLATION
        best_effort, replaced = self._pack_best_effort(cursor, batch, ledger, budget, limit, now)
        realtime = self.realtime.take(cursor)
        self.batch_size.update(pressure)
        return BrosPlan(
            realtime,
            best_effort,
            budget,
            batch.time_with(),
            batch.swap,
            limit,
            pressure,
            late,
            replaced,
            queued,
            self.cost.margin_s(),
        )

    def _pack_realtime(
        self, cursor: MergedCursor, batch: _Batch, ledger: _Ledger, budget: float, limit: int
    ) -> Pressure:
        while (request := cursor.peek()) is not None:
            empty = not batch.realtime
            if len(batch) == limit or (not ledger.fits_realtime(request) and not empty):
                return Pressure.NONE  # the size or the KV pool stopped it, not the time budget
            if batch.time_with(request) > budget and not empty:
                return Pressure.VIOLATION
            cursor.pop()
            batch.add(request)
            ledger.realtime += ledger.need(request)
        return Pressure.NONE

    def _pack_best_effort(
        self, cursor: MergedCursor, batch: _Batch, ledger: _Ledger, budget: float, limit: int, now: float
    ) -> tuple[list[BrosRequest], int]:
        replaced = 0
        for request in sorted(self.best_effort.values(), key=_swap_order):
            request.chunk = None
            if not ledger.fits_best_effort(request):
                break
            if len(batch) < limit and batch.time_with(request) <= budget:
                self._add_best_effort(request, batch, ledger)
                continue
            victim = batch.realtime[-1] if batch.realtime else None
            if victim is not None and self._may_replace(victim, request, batch, ledger, budget, limit, now):
                batch.drop_last_realtime()
                cursor.unpop()
                ledger.realtime -= ledger.need(victim)
                self._add_best_effort(request, batch, ledger)
                replaced += 1
                continue
            if len(batch) < limit and self._chunk_to_budget(request, batch, budget):
                self._add_best_effort(request, batch, ledger)
            break
        return batch.best_effort, replaced

    @staticmethod
    def _chunk_to_budget(request: BrosRequest, batch: _Batch, budget: float) -> bool:
        """Give a BE prompt the longest chunk that keeps the batch within ``budget`` (at least
        `MIN_CHUNK` in an empty batch, which must run something); False when none fits."""
        left = request.prompt_left()
        if not left:
            return not len(batch)
        low, high = 0, left
        while high - low > 1:
            request.chunk = (low + high) // 2
            # A picosecond of slack: a chunk that fits exactly must not fall to the float sum's
            # last bit, which differs with the BLAS the prediction's dot product runs on.
            if batch.time_with(request) <= budget + FIT_SLACK_S:
                low = request.chunk
            else:
                high = request.chunk
        floor = min(MIN_CHUNK, left)
        if low < floor and len(batch):
            request.chunk = None
            return False
        request.chunk = max(low, floor)
        return True

    def _may_replace(
        self,
        victim: BrosRequest,
        request: BrosRequest,
        batch: _Batch,
        ledger: _Ledger,
        budget: float,
        limit: int,
        now: float,
    ) -> bool:
        if len(batch) > limit:
            return False
        time = batch.time_with(request, without=victim)
        return time <= budget and victim.residual(now, self.slo) >= time + self.average_iteration_s

    @staticmethod
    def _add_best_effort(request: BrosRequest, batch: _Batch, ledger: _Ledger) -> None:
        batch.add(request)
        ledger.best_effort += ledger.need(request)
        ledger.takeable -= ledger.resident.get(request.rid, 0)

    def finish(
        self,
        plan: BrosPlan,
        now: float,
        finished: Iterable[str] = (),
        not_run: Iterable[str] = (),
        measured_s: float | None = None,
    ) -> None:
        """The batch ran (``not_run`` could not get KV slots after all): advance, retire the
        finished, and put the other RT requests back at their new deadlines. ``measured_s``, the
        iteration's time, also teaches the cost model's tail how far it ran past the plan."""
        done, skipped = set(finished), set(not_run)
        for request in plan.requests:
            if request.rid not in skipped:
                request.step_done(now)
            if request.rid in done:
                self.remove(request)
            elif request.realtime:
                self.realtime.requeue(request)
        if measured_s is not None:
            self.average_iteration_s += AVERAGE_WEIGHT * (measured_s - self.average_iteration_s)
            if self.cost.tail is not None:
                self.cost.tail.observe(plan.predicted_s - plan.margin_s, measured_s)
