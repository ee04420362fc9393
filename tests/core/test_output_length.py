"""Output-length estimates: exact when fixed, else the sampled mean of the nearest subtree."""

from __future__ import annotations

from sgl_blend.core.output_length import OutputLengthEstimator
from sgl_blend.core.prefix_tree import PrefixTree


def test_exact_requests_need_no_sample() -> None:
    tree = PrefixTree()
    estimator = OutputLengthEstimator(tree, sample_rate=1.0)
    tree.insert(0, [1, 2], 1.0, 1.0)
    assert estimator.register(0, 77, exact=True) is False
    assert estimator.estimate(0) == 77


def test_sample_rate_is_respected_and_seeded() -> None:
    picks = []
    for _run in range(2):
        tree = PrefixTree()
        estimator = OutputLengthEstimator(tree, sample_rate=0.1, seed=3)
        chosen = []
        for request in range(2000):
            tree.insert(request, [request % 7, request], 1.0, 1.0)
            if estimator.register(request, 100, exact=False):
                chosen.append(request)
        picks.append(chosen)
    assert picks[0] == picks[1]
    assert 150 <= len(picks[0]) <= 250


def test_subtree_mean_then_sibling_then_parent_fallback() -> None:
    tree = PrefixTree()
    estimator = OutputLengthEstimator(tree, sample_rate=0.0, fallback=50)
    layout = {0: [1, 1, 1], 1: [1, 1, 2], 2: [1, 1, 2, 5], 3: [1, 9], 4: [8]}
    for request, tokens in layout.items():
        tree.insert(request, tokens, 1.0, 1.0)
        estimator.register(request, 1000, exact=False)
    assert estimator.estimate(0) == 50
    estimator.sampled.update({1, 3})
    estimator.observe(1, 10)
    estimator.observe(3, 30)
    assert estimator.estimate(2) == 10
    assert estimator.estimate(0) == 10
    assert estimator.estimate(4) == 20
    assert estimator.estimate(1) == 10


def test_estimates_never_exceed_the_request_bound() -> None:
    tree = PrefixTree()
    estimator = OutputLengthEstimator(tree, sample_rate=0.0, fallback=500)
    tree.insert(0, [1], 1.0, 1.0)
    estimator.register(0, 16, exact=False)
    assert estimator.estimate(0) == 16
