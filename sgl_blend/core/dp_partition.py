"""Cutting a planned order into k data-parallel shares (paper §5.5).

The plan's order is a DFS of the sorted tree, so any contiguous slice of it is a set of whole
subtrees plus at most one partial root-to-leaf path at each end. Cutting the order into k
contiguous slices of balanced predicted work therefore loses at most one root-to-leaf path of
sharing per cut: the prefix the two requests beside the cut have in common, which both ranks
now compute once each.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate


@dataclass
class Partition:
    parts: list[list[int]]
    work: list[float]
    lost_tokens_per_cut: list[int]

    def imbalance(self) -> float:
        """Largest part's work over the mean (1.0 is perfect balance)."""
        mean = sum(self.work) / len(self.work) if self.work else 0.0
        return max(self.work) / mean if mean else 1.0


def partition_order(
    order: Sequence[int],
    k: int,
    work: Callable[[int], float],
    shared_prefix: Callable[[int, int], int],
) -> Partition:
    """Split ``order`` into ``k`` contiguous parts whose predicted work is as equal as prefix
    sums allow; ``shared_prefix(a, b)`` is the common prompt prefix of two requests."""
    if k < 1:
        raise ValueError("k must be at least 1")
    weights = [work(request) for request in order]
    prefix = list(accumulate(weights, initial=0.0))
    total = prefix[-1]
    cuts = [0]
    for part in range(1, k):
        target = total * part / k
        index = bisect.bisect_left(prefix, target, lo=cuts[-1])
        if index > cuts[-1] and abs(prefix[index - 1] - target) < abs(prefix[min(index, len(order))] - target):
            index -= 1
        cuts.append(min(max(index, cuts[-1]), len(order)))
    cuts.append(len(order))
    parts = [list(order[start:end]) for start, end in zip(cuts, cuts[1:])]
    lost = [
        shared_prefix(order[cut - 1], order[cut]) if 0 < cut < len(order) and cut != previous else 0
        for previous, cut in zip(cuts, cuts[1:-1])
    ]
    return Partition(parts, [prefix[end] - prefix[start] for start, end in zip(cuts, cuts[1:])], lost)
