"""DP shares: every request in exactly one share, balanced work, whole prefix groups, and each
share with the same compute/memory blend as the whole set (which one contiguous slice lacks)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_blend.core.cost_model import BUILTIN_HARDWARE, BUILTIN_MODELS, CostModel
from sgl_blend.core.dp_shares import WorkItem, plan_shares

COST = CostModel(BUILTIN_MODELS["llama-3.1-8b"], BUILTIN_HARDWARE["a100-80g"])


def families(count: int, per_family: int, prefix_len: int, prompt_len: int, output_len: int,
             first_token: int = 0, first_key: int = 0) -> list[WorkItem]:
    """``count`` groups of requests; the requests of a group share a ``prefix_len``-token prefix."""
    items = []
    for family in range(count):
        prefix = [first_token + family * 1000 + token for token in range(prefix_len)]
        for member in range(per_family):
            key = first_key + len(items)
            suffix = [500_000 + key * 1000 + token for token in range(prompt_len - prefix_len)]
            items.append(WorkItem(key, prefix + suffix, output_len, exact_output_len=True))
    return items


def density(items: list[WorkItem]) -> float:
    comp = sum(COST.comp_time(len(item.prompt_ids), item.max_new_tokens) for item in items)
    mem = sum(COST.mem_time(len(item.prompt_ids), item.max_new_tokens) for item in items)
    return comp / mem


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(1, 600)),
                min_size=0, max_size=50), st.integers(1, 6), st.booleans())
def test_every_request_lands_in_exactly_one_share(requests, k, contiguous) -> None:
    items = [WorkItem(100 + index, prompt, output) for index, (prompt, output) in enumerate(requests)]
    shares = plan_shares(items, k, COST, contiguous=contiguous)
    assert len(shares.shares) == k and len(shares.work) == k and len(shares.lost_tokens_per_cut) == k - 1
    assert sorted(key for share in shares.shares for key in share) == [item.key for item in items]
    assert all(lost >= 0 for lost in shares.lost_tokens_per_cut)


def test_prefix_groups_stay_whole_and_work_balances() -> None:
    items = families(8, 12, prefix_len=200, prompt_len=260, output_len=64)
    shares = plan_shares(items, 4, COST)
    family_of = {item.key: item.key // 12 for item in items}
    for share in shares.shares:
        assert len({family_of[key] for key in share}) == 2  # two whole families each
    assert shares.imbalance() < 1.01
    assert shares.lost_tokens_per_cut == [0, 0, 0] and shares.lost_fraction() == 0.0


def test_cutting_a_family_costs_its_shared_prefix_once() -> None:
    items = families(1, 30, prefix_len=300, prompt_len=320, output_len=32)
    shares = plan_shares(items, 2, COST)
    assert sum(shares.lost_tokens_per_cut) == 300
    assert shares.lost_fraction() == 300 / (29 * 300)  # of the 29 x 300 tokens one tree saves


def test_each_share_gets_the_blend_of_the_whole() -> None:
    """Compute-heavy requests (long prompt, short answer) and memory-heavy ones (short prompt, long
    answer): a share of the two-sided cut is as dense as the whole set; contiguous slices are not."""
    items = (families(6, 10, prefix_len=900, prompt_len=1000, output_len=16)
             + families(6, 10, prefix_len=20, prompt_len=40, output_len=900, first_token=100_000, first_key=60))
    by_key = {item.key: item for item in items}
    whole = density(items)
    blended = plan_shares(items, 2, COST)
    sliced = plan_shares(items, 2, COST, contiguous=True)
    for share in blended.shares:
        assert abs(density([by_key[key] for key in share]) / whole - 1) < 0.1
    ratios = sorted(density([by_key[key] for key in share]) / whole for share in sliced.shares)
    assert ratios[0] < 0.5 and ratios[-1] > 2
