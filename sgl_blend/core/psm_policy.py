"""HyGen's extended prefix-sharing maximisation (PSM) with utility ``u`` (HyGen §4.3, Alg. 4).

Offline requests are taken in the DFS order of their prefix tree (maximal sharing), except that
with probability ``1 - u`` the next one is instead the oldest still waiting, so a request with
little sharing is not starved by a stream of newcomers that share a popular prefix. ``u = 1`` is
plain PSM, ``u = 0`` plain FCFS.

Taking from either order and deleting the taken request from both is a merge of two
permutations, so it can be computed once per plan rather than on every pick; the plan is redone
whenever enough new requests arrive, which is when the draws would see a different queue.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

from sgl_blend.core.cost_model import CostModel, HardwareSpec, ModelSpec
from sgl_blend.core.planner import Plan
from sgl_blend.core.policies import PlannedPolicy, make_policy
from sgl_blend.core.policy_registry import REGISTRY

DEFAULT_UTILITY = 0.9


def utility_order(dfs: Sequence[int], oldest_first: Iterable[int], utility: float, rng: random.Random) -> list[int]:
    """Merge two orders of the same requests: each pick is the next unpicked one from ``dfs``
    with probability ``utility``, otherwise the next unpicked one from ``oldest_first``."""
    if not 0.0 <= utility <= 1.0:
        raise ValueError(f"utility must be in [0, 1], got {utility}")
    fresh = list(oldest_first)
    taken: set[int] = set()
    order: list[int] = []
    dfs_at = fresh_at = 0
    while len(order) < len(dfs):
        if rng.random() < utility:
            while dfs[dfs_at] in taken:
                dfs_at += 1
            request = dfs[dfs_at]
        else:
            while fresh[fresh_at] in taken:
                fresh_at += 1
            request = fresh[fresh_at]
        taken.add(request)
        order.append(request)
    return order


class PSMPolicy(PlannedPolicy):
    name = "psm"

    def __init__(self, cost_model: CostModel, *, utility: float = DEFAULT_UTILITY, **kwargs) -> None:
        if not 0.0 <= utility <= 1.0:
            raise ValueError(f"utility must be in [0, 1], got {utility}")
        self.utility = utility
        super().__init__(cost_model, **kwargs)

    def _order(self, include: Callable[[int], bool]) -> Plan:
        dfs = [index for index in self.tree.dfs_order() if include(index)]
        order = utility_order(dfs, self._arrivals(include), self.utility, random.Random(self.seed + self.plans))
        return Plan(order, len(order), 0.0, 0, 1.0)


def make_offline_policy(name: str, model: ModelSpec, hardware: HardwareSpec, **options) -> PlannedPolicy:
    """The policy the registry names ``name`` -- `make_policy`'s, ``psm`` (options: ``utility``), or
    an ablation: its base policy with the entry's options, named ``name`` so that what it reports
    says which it was."""
    entry = REGISTRY.get(name)
    core = entry.core_policy if entry is not None else name
    options = {**(entry.policy_options() if entry is not None else {}), **options}
    policy: PlannedPolicy
    if core == PSMPolicy.name:
        policy = PSMPolicy(CostModel(model, hardware), **options)
    else:
        policy = make_policy(core, model, hardware, **options)
    policy.name = name
    return policy
