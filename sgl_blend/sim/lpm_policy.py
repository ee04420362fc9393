"""SGLang 0.5.23's LPM as it really behaves, for the simulator's baselines.

SGLang orders by longest prefix match only while at most 128 requests wait; above that it
falls back to FCFS (``schedule_policy.py``), which is every moment of a bulk offline job but
its tail. Below the threshold the prefix tree's DFS order stands in for matching each waiting
request against the cache.
"""

from __future__ import annotations

from typing import Callable

from sgl_blend.core.planner import Plan
from sgl_blend.core.policies import PlannedPolicy

LPM_FCFS_THRESHOLD = 128


class SGLangLPMPolicy(PlannedPolicy):
    name = "lpm"
    _fcfs_plan = False

    def _needs_plan(self) -> bool:
        """Re-plan once the queue drops to the threshold, where SGLang switches to matching."""
        return super()._needs_plan() or (self._fcfs_plan and len(self._pending) <= LPM_FCFS_THRESHOLD)

    def _order(self, include: Callable[[int], bool]) -> Plan:
        pending = [index for index in self._arrival if index in self._requests and include(index)]
        self._fcfs_plan = len(pending) > LPM_FCFS_THRESHOLD
        order = pending if self._fcfs_plan else [index for index in self.tree.dfs_order() if include(index)]
        return Plan(order, len(order), 0.0, 0, 1.0)
