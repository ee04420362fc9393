"""DP cuts balance predicted work and lose at most one root-to-leaf path of sharing per cut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_blend.core.dp_partition import partition_order
from sgl_blend.core.prefix_tree import PrefixTree, order_sharing_ratio


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), min_size=1, max_size=60), st.integers(1, 8))
def test_parts_cover_the_order_and_lose_one_path_per_cut(prompts, k) -> None:
    tree = PrefixTree()
    for request, tokens in enumerate(prompts):
        tree.insert(request, tokens, 1.0, 1.0)
    order = tree.dfs_order()

    def common(a: int, b: int) -> int:
        x, y = prompts[a], prompts[b]
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        return n

    partition = partition_order(order, k, lambda r: float(len(prompts[r]) + 1), common)
    assert [r for part in partition.parts for r in part] == order
    assert len(partition.parts) == k
    whole = order_sharing_ratio([prompts[r] for r in order]) * sum(map(len, prompts))
    split = sum(order_sharing_ratio([prompts[r] for r in part]) * sum(len(prompts[r]) for r in part)
                for part in partition.parts if part)
    assert abs((whole - split) - sum(partition.lost_tokens_per_cut)) < 1e-6


def test_equal_work_splits_evenly() -> None:
    partition = partition_order(list(range(100)), 4, lambda _r: 1.0, lambda _a, _b: 0)
    assert [len(part) for part in partition.parts] == [25, 25, 25, 25]
    assert partition.imbalance() == 1.0
