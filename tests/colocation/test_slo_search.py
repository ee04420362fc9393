"""The SLO profiler's search converges on a monotone synthetic replay, and the tightest SLO wins."""

from __future__ import annotations

import pytest

from sgl_blend.core.slo_search import SLO, search_budget


def replay(budget_s: float) -> dict[str, float]:
    """Latency that grows with the budget, as co-located offline work makes it grow."""
    return {"ttft_p99": 0.2 + 4.0 * budget_s, "tbt_p99": 0.02 + 0.5 * budget_s,
            "ttft_mean": 0.1 + budget_s, "tbt_mean": 0.01 + 0.1 * budget_s}


def test_converges_to_the_analytic_budget() -> None:
    # tbt_p99 <= 0.04 * 1.05 -> budget <= (0.042 - 0.02) / 0.5 = 0.044
    result = search_budget(replay, [SLO("tbt_p99", 0.04)], tolerance=0.05, low_s=1e-3, high_s=1.0, steps=20)
    assert result.budget_s == pytest.approx(0.044, rel=1e-3)
    assert result.budget_s <= 0.044
    assert result.binding == ["tbt_p99"]


def test_tightest_of_several_slos_decides() -> None:
    slos = [SLO("tbt_p99", 0.04), SLO("ttft_p99", 0.3)]  # ttft: budget <= (0.315 - 0.2) / 4 = 0.02875
    result = search_budget(replay, slos, tolerance=0.05, low_s=1e-3, high_s=1.0, steps=20)
    assert result.budget_s == pytest.approx(0.02875, rel=1e-3)
    assert "ttft_p99" in result.binding


def test_edges_of_the_range() -> None:
    loose = search_budget(replay, [SLO("tbt_p99", 10.0)], 0.05, 1e-3, 1.0, steps=5)
    assert loose.budget_s == 1.0 and len(loose.steps) == 1
    impossible = search_budget(replay, [SLO("tbt_p99", 0.001)], 0.05, 1e-3, 1.0, steps=5)
    assert impossible.budget_s is None and len(impossible.steps) == 2


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown SLO metric"):
        SLO("e2e_p99", 1.0)
    with pytest.raises(ValueError, match="at least one SLO"):
        search_budget(replay, [], 0.05, 1e-3, 1.0, 3)
    with pytest.raises(ValueError, match="need 0 < low < high"):
        search_budget(replay, [SLO("tbt_p99", 1.0)], 0.05, 1.0, 0.5, 3)
