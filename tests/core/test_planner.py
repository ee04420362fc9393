"""Sort and split produce permutations, keep the sharing the threshold promises, and cut only
between whole one-sided subtrees."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_blend.core.planner import Planner
from sgl_blend.core.prefix_tree import PrefixTree, order_sharing_ratio


def common_prefix(first: list[int], second: list[int]) -> int:
    length = 0
    while length < min(len(first), len(second)) and first[length] == second[length]:
        length += 1
    return length

requests = st.lists(
    st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=10), st.floats(0.01, 10.0), st.floats(0.01, 10.0)),
    min_size=1, max_size=40,
)


def build(items) -> tuple[PrefixTree, list[list[int]]]:
    tree = PrefixTree()
    for request, (tokens, comp, mem) in enumerate(items):
        tree.insert(request, tokens, comp, mem)
    return tree, [tokens for tokens, _comp, _mem in items]


@settings(max_examples=100, deadline=None)
@given(requests, st.sampled_from([0.0, 0.01, 0.2, 1.0]))
def test_plan_is_a_permutation_and_keeps_sharing_within_t(items, threshold) -> None:
    tree, prompts = build(items)
    plan = Planner(tree, split_threshold=threshold).plan()
    assert sorted(plan.order) == list(range(len(items)))
    assert 0 <= plan.boundary <= len(plan.order)
    assert plan.sharing_kept >= 1.0 - threshold - 1e-9
    dfs = order_sharing_ratio([prompts[request] for request in tree.dfs_order()])
    planned = order_sharing_ratio([prompts[request] for request in plan.order])
    assert planned >= (1.0 - threshold) * dfs - 1e-9


@settings(max_examples=60, deadline=None)
@given(requests)
def test_plan_of_a_subset_orders_only_that_subset(items) -> None:
    tree, _prompts = build(items)
    keep = {request for request in range(len(items)) if request % 2 == 0}
    plan = Planner(tree, include=keep.__contains__).plan()
    assert sorted(plan.order) == sorted(keep)


def test_sort_puts_compute_heavy_groups_first_and_split_moves_an_outlier() -> None:
    tree = PrefixTree()
    shared_a, shared_b = [1] * 50, [2] * 50
    for request in range(10):
        tree.insert(request, shared_a + [100 + request], comp=10.0, mem=1.0)
    for request in range(10, 20):
        tree.insert(request, shared_b + [100 + request], comp=0.1, mem=1.0)
    tree.insert(20, shared_a + [7, 7], comp=0.01, mem=5.0)
    unsplit = Planner(tree, split_threshold=0.0).plan()
    assert set(unsplit.order[:10]) <= set(range(10)) | {20}
    split = Planner(tree, split_threshold=0.2).plan()
    assert split.splits >= 1
    assert split.order.index(20) >= split.boundary
    assert set(split.order[: split.boundary]) == set(range(10))


@settings(max_examples=100, deadline=None)
@given(requests, st.sampled_from([0.0, 0.2]))
def test_reuse_is_the_prefix_shared_with_the_previous_request(items, threshold) -> None:
    tree, prompts = build(items)
    plan = Planner(tree, split_threshold=threshold).plan()
    previous: list[int] = []
    for request in plan.order:
        shared = common_prefix(previous, prompts[request])
        if plan.splits:
            assert plan.reuse[request] <= shared
        else:
            assert plan.reuse[request] == shared
        previous = prompts[request]


def test_a_merged_subtree_keeps_its_insertion_order() -> None:
    """Requests under one system prompt, all memory-heavy, are not sorted among themselves: a
    side then takes outputs of mixed lengths, not a run of look-alikes."""
    tree = PrefixTree()
    densities = [0.05, 0.2, 0.01, 0.1, 0.02, 0.15]
    for request, density in enumerate(densities):
        tree.insert(request, [9, 9, 100 + request], comp=density, mem=1.0)
    for request in range(6, 12):
        tree.insert(request, [8, 8, 100 + request], comp=20.0, mem=1.0)
    plan = Planner(tree).plan()
    assert plan.order[plan.boundary:] == list(range(6))
