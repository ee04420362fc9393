"""Sort and split produce permutations, keep the sharing the threshold promises (each subtree
within its share of it), run to convergence, count sharing in densities, and cut only between
whole one-sided subtrees."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_blend.core.cost_model import SharingPrice
from sgl_blend.core.planner import TreePlanner, _outside_longest_non_increasing
from sgl_blend.core.prefix_tree import PrefixTree, order_sharing_ratio

# Seconds a cached token saves, on the scale of the tests' hand-made costs (a few seconds per request).
PRICE = SharingPrice(token=0.001, pair=0.0)
FREE = SharingPrice(token=0.0, pair=0.0)


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
    plan = TreePlanner(tree, PRICE, split_threshold=threshold).plan()
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
    plan = TreePlanner(tree, PRICE, include=keep.__contains__).plan()
    assert sorted(plan.order) == sorted(keep)


def test_sort_puts_compute_heavy_groups_first_and_split_moves_an_outlier() -> None:
    tree = PrefixTree()
    shared_a, shared_b = [1] * 50, [2] * 50
    for request in range(10):
        tree.insert(request, shared_a + [100 + request], comp=10.0, mem=1.0)
    for request in range(10, 20):
        tree.insert(request, shared_b + [100 + request], comp=0.1, mem=1.0)
    tree.insert(20, shared_a + [7, 7], comp=0.01, mem=5.0)
    unsplit = TreePlanner(tree, PRICE, split_threshold=0.0).plan()
    assert set(unsplit.order[:10]) <= set(range(10)) | {20}
    # the outlier's share of the budget is half (two families) of an eleventh (its siblings)
    split = TreePlanner(tree, PRICE, split_threshold=2.0).plan()
    assert split.splits >= 1
    assert split.order.index(20) >= split.boundary
    assert set(split.order[: split.boundary]) == set(range(10))


@settings(max_examples=100, deadline=None)
@given(requests, st.sampled_from([0.0, 0.2]))
def test_reuse_is_the_prefix_shared_with_the_previous_request(items, threshold) -> None:
    tree, prompts = build(items)
    plan = TreePlanner(tree, PRICE, split_threshold=threshold).plan()
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
    plan = TreePlanner(tree, PRICE).plan()
    assert plan.order[plan.boundary:] == list(range(6))


def test_densities_discount_exactly_the_prefill_that_shared_tokens_save() -> None:
    """Three prompts under one 100-token prefix, each with a 2-token tail: running them together
    computes the prefix once, so 200 tokens and 2 x 100^2 / 2 pairs are saved."""
    price = SharingPrice(token=0.01, pair=0.0001)
    tree = PrefixTree()
    prefix = [5] * 100
    for request in range(3):
        tree.insert(request, prefix + [10 + request, 1], comp=4.0, mem=2.0)
    saved = price.saving(200, 2 * 100 * 100 / 2)
    assert TreePlanner(tree, price).plan().root_density == pytest.approx((12.0 - saved) / 6.0)
    assert TreePlanner(tree, FREE).plan().root_density == pytest.approx(2.0)


def test_sharing_moves_a_few_shot_family_to_the_memory_side() -> None:
    """Without sharing counted, a family of few-shot prompts looks compute-heavy; with the prefix
    computed once it is lighter than the unique prompts beside it, and the sort says so."""
    price = SharingPrice(token=0.01, pair=0.0)
    tree = PrefixTree()
    for request in range(10):
        tree.insert(request, [1] * 400 + [100 + request], comp=5.0, mem=1.0)
    for request in range(10, 20):
        tree.insert(request, [2, 100 + request, 7], comp=3.0, mem=1.0)
    counted = TreePlanner(tree, price).plan()
    ignored = TreePlanner(tree, FREE).plan()
    assert set(ignored.order[:10]) == set(range(10))
    assert set(counted.order[:10]) == set(range(10, 20))


def test_a_subtree_splits_only_within_its_share_of_the_budget() -> None:
    """Two families under the root, the outlier one of two children of its family's node: the
    whole budget could pay to move it, but its share (a half of a half, Algorithm 2) cannot
    until the budget is four times its cost."""
    tree = PrefixTree()
    for request in range(10):
        tree.insert(request, [1] * 40 + [50, 100 + request], comp=10.0, mem=1.0)
    for request in range(10, 20):
        tree.insert(request, [2] * 40 + [100 + request], comp=0.1, mem=1.0)
    tree.insert(20, [1] * 40 + [7], comp=0.01, mem=5.0)
    saved = tree.root.saved
    cost = 40  # the outlier recomputes its family's 40-token prefix
    short = TreePlanner(tree, FREE, split_threshold=2 * cost / saved).plan()
    assert short.splits == 0 and not short.monotone
    enough = TreePlanner(tree, FREE, split_threshold=4 * cost / saved).plan()
    assert enough.splits == 1 and enough.monotone
    assert enough.order.index(20) == 20
    assert enough.sharing_kept == pytest.approx(1 - cost / saved)


def test_split_runs_to_a_non_increasing_order_when_the_budget_allows() -> None:
    """Outliers nested two levels deep, where the first split reveals the next: sort, split and
    sort again until the leaf order is non-increasing (C1)."""
    tree = PrefixTree()
    densities = {0: 9.0, 1: 8.0, 2: 0.2, 3: 7.0, 4: 0.1, 5: 6.0, 6: 5.0, 7: 0.3}
    prompts = {0: [1, 1, 10], 1: [1, 1, 11], 2: [1, 1, 12], 3: [1, 2, 13], 4: [1, 2, 14],
               5: [3, 3, 15], 6: [3, 3, 16], 7: [3, 4, 17]}
    for request, density in densities.items():
        tree.insert(request, prompts[request], comp=density, mem=1.0)
    plan = TreePlanner(tree, FREE, split_threshold=1e6).plan()
    assert plan.monotone and plan.rounds >= 2
    left = plan.order[:plan.boundary]
    right = plan.order[plan.boundary:]
    assert set(left) == {0, 1, 3, 5, 6} and set(right) == {2, 4, 7}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-100, 100), max_size=60))
def test_the_outliers_are_the_fewest_whose_removal_leaves_a_non_increasing_sequence(values) -> None:
    outliers = set(_outside_longest_non_increasing(values))
    kept = [value for position, value in enumerate(values) if position not in outliers]
    assert all(first >= second for first, second in zip(kept, kept[1:]))
    longest = [1] * len(values)  # O(n^2) reference
    for end in range(len(values)):
        for start in range(end):
            if values[start] >= values[end]:
                longest[end] = max(longest[end], longest[start] + 1)
    assert len(kept) == max(longest, default=0)
