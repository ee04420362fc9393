"""The emulated co-location bench's judge: the SLO tolerance is online-only's measured seed-to-seed
spread (so online-only meets its own SLO on every seed, and would not at less), a configuration
counts where it met the SLO on 2 of 3 seeds, and a baseline that missed the SLO is refused rather
than compared with.

The runs are written out by hand: what is judged is the arithmetic on them, which is all the judge
does with a run the emulated engine measured.
"""

from __future__ import annotations

import math

import pytest

from bench import colocation_emulated as bench
from bench import seed_judge


def run(ttft_ms: float, tbt_ms: float, offline: float = 0.0) -> dict[str, float]:
    return {"ttft_p99": ttft_ms / 1000, "tbt_p99": tbt_ms / 1000, "offline_tokens_per_s": offline}


ONLINE_ONLY = [run(100, 20), run(112, 21), run(106, 20.5)]


def test_the_tolerance_is_the_seed_spread_online_only_needs_to_meet_its_own_slo() -> None:
    targets = seed_judge.slo_targets(ONLINE_ONLY)
    tolerance = seed_judge.tolerance(ONLINE_ONLY)

    assert targets == pytest.approx({"ttft_p99": 0.106, "tbt_p99": 0.0205})
    assert seed_judge.seed_spread(ONLINE_ONLY) == pytest.approx({"ttft_p99": 0.12, "tbt_p99": 0.05})
    assert tolerance == pytest.approx(0.12)
    assert all(not seed_judge.violated(reference, targets, tolerance) for reference in ONLINE_ONLY)
    slowest = max(ONLINE_ONLY, key=lambda reference: reference["ttft_p99"])
    assert seed_judge.violated(slowest, targets, tolerance / 3) == ["ttft_p99"]


def test_a_spread_needs_two_seeds_and_a_positive_latency() -> None:
    with pytest.raises(ValueError, match="at least two seeds"):
        seed_judge.tolerance(ONLINE_ONLY[:1])
    with pytest.raises(ValueError, match="no spread"):
        seed_judge.tolerance([run(0, 20), run(10, 20)])


def test_a_configuration_meets_the_slo_on_two_of_three_seeds_and_a_failed_run_misses_it() -> None:
    targets, tolerance = seed_judge.slo_targets(ONLINE_ONLY), seed_judge.tolerance(ONLINE_ONLY)
    two_of_three = [run(110, 21, 900), run(500, 21, 1500), run(115, 22, 1200)]
    failed = {"failed": "server start: gone", "offline_tokens_per_s": 0.0, "ttft_p99": math.inf, "tbt_p99": math.inf}

    verdict = seed_judge.verdict("hygen", two_of_three, targets, tolerance)
    assert (verdict.seeds_met, verdict.met, verdict.offline_tokens_per_s) == (2, True, 1200.0)
    assert not seed_judge.verdict("echo", [two_of_three[0], two_of_three[1], failed], targets, tolerance).met


def cell(baseline: list[dict[str, float]]) -> dict:
    return {
        "targets_s": seed_judge.slo_targets(ONLINE_ONLY),
        "tolerance": seed_judge.tolerance(ONLINE_ONLY),
        "runs": {
            "online-only": ONLINE_ONLY,
            "hygen": [run(104, 20, 3000), run(110, 21, 3300), run(108, 20, 3000)],
            bench.BASELINE: baseline,
        },
    }


def test_the_judge_refuses_a_baseline_that_misses_the_slo() -> None:
    missed = cell([run(400, 20, 9000), run(105, 20, 9000), run(380, 30, 9000)])
    met = cell([run(105, 20, 1000), run(108, 21, 1100), run(109, 20, 1200)])

    refused = bench.judged(missed)["over_baseline"]["hygen"]
    assert refused["ratio"] is None and refused["why"].startswith("baseline refused: it met the SLO on 1 of 3")
    assert bench.judged(met)["over_baseline"]["hygen"] == {"ratio": 2.82, "why": ""}
    assert bench.goals([{**met, "judged": bench.judged(met)}])["hygen"]["met"]
    assert not bench.goals([{**missed, "judged": bench.judged(missed)}])["hygen"]["met"]


def test_bros_is_held_to_the_best_priority_run_that_attains_the_absolute_slo() -> None:
    """BROS's goal is against SGLang's priority scheduling at the same attainment of the absolute
    SLO: among every concurrency the baseline was tried at, the best that attained it. A faster
    try that missed it does not count; a BROS that missed it on 2 of 3 seeds misses the goal."""
    absolute = {"ttft_p99": 0.4, "tbt_p99": 0.1}
    trials = [{"value": 8, **run(900, 40, 5000)}, {"value": 2, **run(300, 40, 1000)}, {"value": 1, **run(200, 30, 600)}]
    base = cell([run(250, 30, 700), run(260, 31, 650), run(240, 29, 750)])
    attaining = {**base, "search": {bench.BASELINE: {"trials": trials}},
                 "runs": {**base["runs"], "bros": [run(350, 90, 1400), run(390, 95, 1300), run(380, 99, 1200)]}}
    goal = bench.bros_goal([{**attaining, "share": 0.3}], absolute)
    assert goal is not None and goal["loads"][0]["priority_best_attaining_tokens_per_s"] == 1000
    assert goal["loads"][0]["ratio"] == 1.3 and goal["met"]

    missing = {**attaining, "runs": {**attaining["runs"], "bros": [run(450, 90, 9000), run(390, 120, 9000),
                                                                 run(380, 99, 9000)]}}
    assert not bench.bros_goal([{**missing, "share": 0.3}], absolute)["met"]


def fake_engine(threshold: float, evaluated: list[float]):
    """A knob whose P99s equal its value: it meets targets of ``threshold`` exactly up to it."""

    def evaluate(value: float) -> dict[str, float]:
        evaluated.append(value)
        return {"ttft_p99": value, "tbt_p99": value, "offline_tokens_per_s": 1000 * value}

    return evaluate


TARGETS = {"ttft_p99": 0.02, "tbt_p99": 0.02}


@pytest.mark.parametrize("start", [0.016, 0.032])
def test_the_engine_checks_the_simulators_choice_first_and_searches_on_one_side(start: float) -> None:
    evaluated: list[float] = []

    found = bench.search("knob", fake_engine(0.02, evaluated), TARGETS, 0.0, 0.008, 0.064, 1.2, start=start)

    assert evaluated[0] == start
    assert len(evaluated) == len(set(evaluated)), "no value runs twice"
    if start <= 0.02:  # met: the search goes on above it
        assert min(evaluated) == start
    else:  # missed: below it
        assert max(evaluated) == start
    assert found["met"] and 0.02 / 1.2 <= found["value"] <= 0.02
    assert [trial["value"] for trial in found["trials"]] == evaluated


def test_a_simulators_choice_at_an_end_of_the_range_ends_the_search() -> None:
    evaluated: list[float] = []

    floor = bench.search("knob", fake_engine(0.02, evaluated), {"ttft_p99": 0.001}, 0.0, 0.008, 0.064, 1.2, start=0.008)
    top = bench.search("knob", fake_engine(0.02, evaluated), {"ttft_p99": 1.0, "tbt_p99": 1.0}, 0.0,
                       0.008, 0.064, 1.2, start=0.064)

    assert evaluated == [0.008, 0.064]
    assert (floor["value"], floor["met"], floor["binding"]) == (0.008, False, ["ttft_p99"])
    assert (top["value"], top["met"]) == (0.064, True)
