"""Real-time queues in residual-time order, without re-sorting every iteration (BROS §IV-B, Fig. 7).

A request's residual ``T_SLO - t_i`` shrinks at the same rate for every request, so the order by
residual is the order by deadline, and a deadline only moves when the request produces a token.
The waiting queue (no token yet, deadline ``arrival + TTFT``) is therefore already sorted by
arrival; the pending queue (deadline ``last token + TPOT``) is kept sorted by inserting each
request where it belongs after its step. Alg. 1 reads both through a `MergedCursor`, which
polls whichever head is more urgent, and can give back the requests it took last (Alg. 1's
"front insert" when a best-effort request replaces the least urgent real-time one).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from sgl_blend.core.bros.requests import SLO, BrosRequest


class RealtimeQueues:
    def __init__(self, slo: SLO) -> None:
        self.slo = slo
        self.waiting: deque[BrosRequest] = deque()
        self._pending_keys: list[tuple[float, int]] = []
        self._pending: list[BrosRequest] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self.waiting) + len(self._pending)

    def arrive(self, request: BrosRequest) -> None:
        """A new request (one with output already joins the pending queue); arrivals come in
        time order, so the waiting queue stays sorted."""
        if not request.prefilled and self.waiting and request.arrival < self.waiting[-1].arrival:
            raise ValueError(f"request {request.rid!r} arrived before the last queued one")
        self._seq += 1
        request.seq = self._seq
        if request.prefilled:
            self.requeue(request)
        else:
            self.waiting.append(request)

    def requeue(self, request: BrosRequest) -> None:
        """Put back a request that ran or was passed over, at its (new) deadline."""
        if not request.prefilled:
            arrivals = [queued.arrival for queued in self.waiting]
            self.waiting.insert(bisect.bisect_right(arrivals, request.arrival), request)
            return
        key = (request.deadline(self.slo), request.seq)
        position = bisect.bisect_left(self._pending_keys, key)
        self._pending_keys.insert(position, key)
        self._pending.insert(position, request)

    def remove(self, request: BrosRequest) -> None:
        """Forget a request (finished or aborted) wherever it is."""
        if request in self.waiting:
            self.waiting.remove(request)
            return
        for position, queued in enumerate(self._pending):
            if queued is request:
                del self._pending[position], self._pending_keys[position]
                return

    def in_order(self) -> Iterator[BrosRequest]:
        """Every request, most urgent first (a read-only merge of the two heads)."""
        cursor = MergedCursor(self)
        while (request := cursor.pop()) is not None:
            yield request

    def cursor(self) -> MergedCursor:
        return MergedCursor(self)

    def take(self, cursor: MergedCursor) -> list[BrosRequest]:
        """Remove what ``cursor`` popped (a prefix of each queue) and return it, in pop order."""
        taken = cursor.popped()
        for _ in range(cursor.waiting_taken):
            self.waiting.popleft()
        del self._pending[: cursor.pending_taken], self._pending_keys[: cursor.pending_taken]
        return taken


class MergedCursor:
    """Alg. 1's view of ``Q^rt``: pop the most urgent request, or give back the last popped."""

    def __init__(self, queues: RealtimeQueues) -> None:
        self._queues = queues
        self.waiting_taken = 0
        self.pending_taken = 0
        self._sources: list[bool] = []

    def _heads(self) -> tuple[BrosRequest | None, BrosRequest | None]:
        queues = self._queues
        waiting = queues.waiting[self.waiting_taken] if self.waiting_taken < len(queues.waiting) else None
        pending = queues._pending[self.pending_taken] if self.pending_taken < len(queues._pending) else None
        return waiting, pending

    def _waiting_first(self) -> bool | None:
        waiting, pending = self._heads()
        if waiting is None or pending is None:
            return None if waiting is None and pending is None else waiting is not None
        slo = self._queues.slo
        return waiting.deadline(slo) <= pending.deadline(slo)

    def peek(self) -> BrosRequest | None:
        first = self._waiting_first()
        if first is None:
            return None
        waiting, pending = self._heads()
        return waiting if first else pending

    def pop(self) -> BrosRequest | None:
        first = self._waiting_first()
        if first is None:
            return None
        request = self.peek()
        if first:
            self.waiting_taken += 1
        else:
            self.pending_taken += 1
        self._sources.append(first)
        return request

    def unpop(self) -> None:
        """Give back the request popped last; it becomes the head again."""
        if self._sources.pop():
            self.waiting_taken -= 1
        else:
            self.pending_taken -= 1

    def popped(self) -> list[BrosRequest]:
        queues = self._queues
        waiting, pending = iter(list(queues.waiting)[: self.waiting_taken]), iter(queues._pending[: self.pending_taken])
        return [next(waiting) if source else next(pending) for source in self._sources]
