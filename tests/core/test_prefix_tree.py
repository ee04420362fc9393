"""The prefix tree's aggregates stay exact under inserts and removes, and DFS reaches maximal sharing."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_blend.core.prefix_tree import PrefixTree, order_sharing_ratio

prompts = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=30)


def brute_saved(tree: PrefixTree, node) -> int:
    return sum(n.edge_len * max(n.count - 1, 0) for n in tree.iter_nodes(node))


def check_aggregates(tree: PrefixTree, live: dict[int, list[int]]) -> None:
    for node in tree.iter_nodes():
        under = [request for n in tree.iter_nodes(node) for request in n.requests]
        assert node.count == len(under)
        assert node.prompt_tokens == sum(len(live[request]) for request in under)
        assert abs(node.comp - sum(float(request) for request in under)) < 1e-6
        assert abs(node.mem - sum(2.0 * request for request in under)) < 1e-6
        assert node.saved == brute_saved(tree, node)
    for request, tokens in live.items():
        assert list(tree.tokens(request)) == tokens


@settings(max_examples=80, deadline=None)
@given(prompts, st.randoms(use_true_random=False))
def test_aggregates_match_brute_force_after_inserts_and_removes(prompt_list, rng) -> None:
    tree = PrefixTree()
    live: dict[int, list[int]] = {}
    for request, tokens in enumerate(prompt_list):
        tree.insert(request, tokens, float(request), 2.0 * request)
        live[request] = tokens
    check_aggregates(tree, live)
    for request in rng.sample(sorted(live), k=len(live) // 2):
        tree.remove(request)
        del live[request]
    check_aggregates(tree, live)
    assert sorted(tree.dfs_order()) == sorted(live)


@settings(max_examples=80, deadline=None)
@given(prompts)
def test_dfs_order_reaches_the_maximal_sharing_ratio(prompt_list) -> None:
    tree = PrefixTree()
    for request, tokens in enumerate(prompt_list):
        tree.insert(request, tokens, 1.0, 1.0)
    order = tree.dfs_order()
    assert sorted(order) == list(range(len(prompt_list)))
    dfs_ratio = order_sharing_ratio([prompt_list[request] for request in order])
    assert abs(dfs_ratio - tree.sharing_ratio()) < 1e-9
    shuffled = list(range(len(prompt_list)))
    random.Random(0).shuffle(shuffled)
    assert order_sharing_ratio([prompt_list[request] for request in shuffled]) <= dfs_ratio + 1e-9


def test_identical_prompts_share_a_node() -> None:
    tree = PrefixTree()
    first = tree.insert(0, [5, 6, 7], 1.0, 1.0)
    second = tree.insert(1, [5, 6, 7], 1.0, 1.0)
    assert first is second and first.requests == [0, 1]
    assert tree.sharing_ratio() == 0.5
