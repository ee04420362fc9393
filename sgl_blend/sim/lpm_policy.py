"""SGLang 0.5.23's LPM schedule, as an `AdmissionPolicy`, for the simulator's baseline.

``SchedulePolicy._determine_active_policy`` turns LPM into FCFS whenever more than
``WAITING_QUEUE_PREFIX_MATCH_MAX = 128`` requests wait, to skip the prefix matching. In a bulk
offline job that is every iteration but the last 128 requests: LPM is FCFS over the submission
order until then, and only the tail is sorted by longest cached prefix, re-sorted every
iteration. The match length here is the deepest node of the request's prompt path that an
admitted request has put in the cache (the tree of pending prompts stands in for SGLang's radix
cache; evictions in that short tail are ignored).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sgl_blend.core.planner import Plan
from sgl_blend.core.policies import PlannedPolicy
from sgl_blend.core.prefix_tree import Node

WAITING_QUEUE_PREFIX_MATCH_MAX = 128


class SGLangLPMPolicy(PlannedPolicy):
    name = "lpm"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cached: set[Node] = set()

    def admitted(self, rids: Iterable[str]) -> None:
        rids = list(rids)
        for rid in rids:
            self._cached.update(self.tree.path(self.tree.node_of[self._by_rid[rid].index]))
        super().admitted(rids)

    def _matching(self) -> bool:
        return self.pending_count() <= WAITING_QUEUE_PREFIX_MATCH_MAX

    def _needs_plan(self) -> bool:
        return super()._needs_plan() or (self._matching() and self.pending_count() > 0)

    def _match_len(self, index: int) -> int:
        node: Node | None = self.tree.node_of[index]
        while node is not None and node not in self._cached:
            node = node.parent
        return node.prefix_len() if node is not None else 0

    def _order(self, include: Callable[[int], bool]) -> Plan:
        order = self._arrivals(include)
        if self._matching():
            order.sort(key=self._match_len, reverse=True)
        return Plan(order, len(order), 0.0, 0, 1.0)
