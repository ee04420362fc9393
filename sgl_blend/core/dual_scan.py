"""The dual scanner (paper §4.4, Algorithm 3) with runtime adaptation.

A plan's order runs from compute-heavy to memory-heavy. One cursor walks the compute side from
the left, the other the memory side from the right (both in DFS order, so each keeps prefix
sharing), and KV memory is partitioned so that the two sides together hold work at the root's
density: ``M_L rho_L + M_R rho_R = M rho_root``, with the densities of the plan (a re-plan
refreshes them as the pending set changes). A side whose share is full waits
for its own requests to finish; a request that outgrows its estimate on the compute side is
moved to the memory side's account.
"""

from __future__ import annotations

from typing import Callable

from sgl_blend.core.cost_model import memory_partition

COMPUTE = "compute"
MEMORY = "memory"


class DualScanner:
    """Scans one plan. Costs come from callbacks so estimates can change while it runs."""

    def __init__(
        self,
        order: list[int],
        boundary: int,
        capacity: float,
        cost: Callable[[int], tuple[float, float]],
        footprint: Callable[[int], float],
    ) -> None:
        self.order = order
        self.boundary = boundary
        self.capacity = capacity
        self._cost = cost
        self._footprint = footprint
        self._left = 0
        self._right = len(order) - 1
        self._done: set[int] = set()
        self._taken = 0
        self._retry: dict[str, list[int]] = {COMPUTE: [], MEMORY: []}
        self.side_of: dict[int, str] = {}
        self.held: dict[int, float] = {}
        self.used = {COMPUTE: 0.0, MEMORY: 0.0}
        self._remaining = {COMPUTE: [0.0, 0.0], MEMORY: [0.0, 0.0]}
        for index, request in enumerate(order):
            comp, mem = cost(request)
            side = self._remaining[COMPUTE if index < boundary else MEMORY]
            side[0] += comp
            side[1] += mem
        self._region = {request: (COMPUTE if index < boundary else MEMORY) for index, request in enumerate(order)}
        self._planned = {side: tuple(totals) for side, totals in self._remaining.items()}
        self._shape: dict[str, tuple[float, float]] = {}

    def set_side_shapes(self, shapes: dict[str, tuple[float, float]]) -> None:
        """Mean prompt and output length of each side's requests, for the prefill budget."""
        self._shape = shapes

    def prefill_budget(self) -> float | None:
        """Prefill tokens per iteration (Alg. 3, steps 2-3): a side's memory share holds
        ``N = M / (p + d/2)`` decoding requests, and replacing them as they finish takes
        ``C = N p / d`` prefill tokens per decode step. Spreading prefill this thinly is what
        lets every iteration overlap compute with memory instead of alternating between them."""
        if not self._shape:
            return None
        budgets = self.budgets()
        total = 0.0
        for side, (prompt, output) in self._shape.items():
            if output > 0 and budgets.get(side, 0.0) > 0:
                total += budgets[side] / (prompt + output / 2.0) * prompt / output
        return total

    def budgets(self) -> dict[str, float]:
        """``M_L`` and ``M_R`` from the planned densities of root and sides (Alg. 3, step 1),
        with the degenerate cases: a side with nothing left pending cedes all memory."""
        left_comp, left_mem = self._planned[COMPUTE]
        right_comp, right_mem = self._planned[MEMORY]
        if not self._has_pending(COMPUTE):
            return {COMPUTE: 0.0, MEMORY: self.capacity}
        if not self._has_pending(MEMORY):
            return {COMPUTE: self.capacity, MEMORY: 0.0}
        rho_left = left_comp / left_mem if left_mem > 0 else float("inf")
        rho_right = right_comp / right_mem if right_mem > 0 else 0.0
        rho_root = (left_comp + right_comp) / (left_mem + right_mem)
        if rho_left == float("inf"):
            return {COMPUTE: self.capacity, MEMORY: 0.0}
        left, right = memory_partition(self.capacity, rho_root, rho_left, rho_right)
        return {COMPUTE: left, MEMORY: right}

    def _has_pending(self, side: str) -> bool:
        return bool(self._retry[side]) or self._peek(side, set()) is not None

    def _peek(self, side: str, skip: set[int]) -> int | None:
        """Next request of a side from its cursor, skipping done and tentatively chosen ones."""
        for request in self._retry[side]:
            if request not in skip:
                return request
        if side == COMPUTE:
            index = self._left
            while index < self.boundary and index <= self._right:
                request = self.order[index]
                if request not in self._done and request not in skip:
                    return request
                index += 1
        else:
            index = self._right
            while index >= self.boundary and index >= self._left:
                request = self.order[index]
                if request not in self._done and request not in skip:
                    return request
                index -= 1
        return None

    def _advance(self) -> None:
        while self._left < len(self.order) and self.order[self._left] in self._done:
            self._left += 1
        while self._right >= 0 and self.order[self._right] in self._done:
            self._right -= 1

    def propose(self, free: float, limit: int) -> list[tuple[int, str]]:
        """Requests to admit now and the side each counts against, alternating toward the side
        with the most unused share, until both shares (or ``free``) are exhausted."""
        budgets = self.budgets()
        used = dict(self.used)
        chosen: list[tuple[int, str]] = []
        skip: set[int] = set()
        blocked: set[str] = set()
        while len(chosen) < limit and len(blocked) < 2:
            open_sides = [side for side in (COMPUTE, MEMORY) if side not in blocked]
            side = max(open_sides, key=lambda s: budgets[s] - used[s])
            request = self._peek(side, skip)
            if request is None:
                blocked.add(side)
                continue
            size = self._footprint(request)
            fits_side = used[side] + size <= budgets[side] or (used[side] == 0 and budgets[side] > 0)
            if not fits_side or size > free:
                blocked.add(side)
                continue
            chosen.append((request, side))
            skip.add(request)
            used[side] += size
            free -= size
        return chosen

    def admit(self, request: int, side: str) -> None:
        if request in self._retry[side]:
            self._retry[side].remove(request)
        size = self._footprint(request)
        self.side_of[request] = side
        self.held[request] = size
        self.used[side] += size
        self._take(request)

    def _take(self, request: int) -> None:
        """Mark a request of this plan's order as no longer pending (requests admitted under an
        earlier plan and requeued here are not in the order and need no bookkeeping)."""
        if request in self._done or request not in self._region:
            return
        self._done.add(request)
        self._taken += 1
        comp, mem = self._cost(request)
        remaining = self._remaining[self._region[request]]
        remaining[0] -= comp
        remaining[1] -= mem
        self._advance()

    def release(self, request: int) -> None:
        """A running request finished: its memory goes back to its side."""
        side = self.side_of.pop(request, None)
        if side is not None:
            self.used[side] -= self.held.pop(request)

    def requeue(self, request: int) -> None:
        """A running request was preempted: free its share and offer it again first."""
        side = self.side_of.get(request, self._region.get(request, MEMORY))
        self.release(request)
        self._retry[side].append(request)

    def withdraw(self, request: int) -> None:
        for queue in self._retry.values():
            if request in queue:
                queue.remove(request)
        self.release(request)
        self._take(request)

    def move_to_memory_side(self, request: int, new_footprint: float) -> None:
        """Runtime adaptation: an under-estimated request now holds more KV than planned and
        behaves like memory-side work, so it is accounted there."""
        side = self.side_of.get(request)
        if side is None:
            return
        self.used[side] -= self.held[request]
        self.side_of[request] = MEMORY
        self.held[request] = new_footprint
        self.used[MEMORY] += new_footprint

    def pending(self) -> int:
        return len(self.order) - self._taken + sum(len(queue) for queue in self._retry.values())
