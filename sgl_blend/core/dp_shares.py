"""Dividing a known request set among data-parallel schedulers (paper §5.5).

BlendServe builds one resource-aware prefix tree over all requests, plans it (layer-wise sort,
split, merge), and cuts the planned order into balanced shares, one per DP rank. The plan runs
from compute-heavy requests on the left to memory-heavy ones on the right, so a share made of
one contiguous slice would leave one rank all compute and another all memory, and neither could
overlap the two. The shares are therefore formed the way the dual scanner forms batches: each
side of the plan (left of the planner's boundary and right of it) is cut into k contiguous
slices of equal predicted work with `partition_order`, and rank i takes the i-th slice from the
left end together with the i-th slice from the right end. Every rank then holds whole subtrees
and the same blend as the whole set; each cut loses at most one root-to-leaf path of sharing on
each side. ``contiguous=True`` cuts the whole order instead (the literal one-slice reading), for
comparison.

Output lengths are estimated without sampling -- the exact length where a request fixes it,
else its bound capped by the estimator's fallback -- because the shares must exist before any
request has run; each rank's own scheduler still samples and adapts within its share.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from sgl_blend.core.cost_model import CostModel
from sgl_blend.core.dp_partition import Partition, partition_order
from sgl_blend.core.output_length import OutputLengthEstimator
from sgl_blend.core.planner import DEFAULT_SPLIT_THRESHOLD, TreePlanner
from sgl_blend.core.prefix_tree import PrefixTree

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class WorkItem(Generic[K]):
    """One request to place: its prompt's token ids and its output-length bound. ``key`` is the
    caller's name for it (a line's index, or its ``(file, line)``)."""

    key: K
    prompt_ids: Sequence[int]
    max_new_tokens: int
    exact_output_len: bool = False


@dataclass
class DPShares(Generic[K]):
    """``shares[i]`` holds the keys rank i runs, in plan order; ``work`` is each share's
    predicted time; ``lost_tokens_per_cut`` the shared prefix tokens each cut costs (both sides
    of a cut together)."""

    shares: list[list[K]]
    work: list[float]
    lost_tokens_per_cut: list[int]
    shared_tokens: int

    def imbalance(self) -> float:
        """Largest share's work over the mean (1.0 is perfect balance)."""
        mean = sum(self.work) / len(self.work) if self.work else 0.0
        return max(self.work) / mean if mean else 1.0

    def lost_fraction(self) -> float:
        """Prompt tokens the cuts stop sharing, over all tokens sharing saves in one tree."""
        return sum(self.lost_tokens_per_cut) / self.shared_tokens if self.shared_tokens else 0.0


def plan_shares(
    items: Iterable[WorkItem[K]],
    k: int,
    cost_model: CostModel,
    *,
    split_threshold: float = DEFAULT_SPLIT_THRESHOLD,
    contiguous: bool = False,
) -> DPShares[K]:
    """Assign every item to one of ``k`` shares (see the module docstring)."""
    if k < 1:
        raise ValueError("k must be at least 1")
    tree = PrefixTree()
    estimator = OutputLengthEstimator(tree, sample_rate=0.0)
    keys: list[K] = []
    for index, item in enumerate(items):
        keys.append(item.key)
        estimator.register(index, item.max_new_tokens, item.exact_output_len)
        output = estimator.estimate(index)
        prompt = len(item.prompt_ids)
        tree.insert(index, item.prompt_ids, cost_model.comp_time(prompt, output), cost_model.mem_time(prompt, output))
    if not keys:
        return DPShares([[] for _ in range(k)], [0.0] * k, [0] * (k - 1), 0)
    plan = TreePlanner(tree, cost_model.sharing_price(), split_threshold=split_threshold).plan()

    def shared_prefix(a: int, b: int) -> int:
        return _shared_prefix(tree, a, b)

    def work(index: int) -> float:
        comp, mem = tree.cost(index)
        return comp + mem

    if contiguous:
        sides = [partition_order(plan.order, k, work, shared_prefix)]
    else:
        left, right = plan.order[: plan.boundary], plan.order[plan.boundary :]
        sides = [
            partition_order(left, k, work, shared_prefix),
            _reversed(partition_order(right[::-1], k, work, shared_prefix)),
        ]
    shares = [[keys[index] for side in sides for index in side.parts[rank]] for rank in range(k)]
    return DPShares(
        shares,
        [sum(side.work[rank] for side in sides) for rank in range(k)],
        [sum(side.lost_tokens_per_cut[cut] for side in sides) for cut in range(k - 1)],
        tree.root.saved,
    )


def _reversed(partition: Partition) -> Partition:
    """A partition of the right side cut from its far end: slice i counts from the right, as the
    memory cursor scans; each slice is put back in plan order."""
    return Partition([part[::-1] for part in partition.parts], partition.work, partition.lost_tokens_per_cut)


def _shared_prefix(tree: PrefixTree, a: int, b: int) -> int:
    """Prompt tokens two requests have in common: the depth of their deepest common tree node,
    capped by either prompt (a prompt may end inside a node's edge only at its own node)."""
    ancestors = {id(node) for node in tree.path(tree.node_of[a])}
    node = tree.node_of[b]
    while id(node) not in ancestors:
        parent = node.parent
        assert parent is not None, "the root is an ancestor of every node"
        node = parent
    return min(node.prefix_len(), tree.prompt_len[a], tree.prompt_len[b])
