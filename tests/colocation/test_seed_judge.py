"""The emulated co-location bench's judge: the SLO tolerance is online-only's measured seed-to-seed
spread (so online-only meets its own SLO on every seed, and would not at less), a configuration
counts where it met the SLO on 2 of 3 seeds, and a baseline that missed the SLO is refused: its
throughput does not count, and it is scored at the floor of its search, or 0 where that missed too.

The runs are written out by hand: what is judged is the arithmetic on them, which is all the judge
does with a run the emulated engine measured.
"""

from __future__ import annotations

import json
import math

import pytest

from bench import colocation_emulated as bench
from bench import seed_judge


def run(ttft_ms: float, tbt_ms: float, offline: float = 0.0) -> dict[str, float]:
    return {"ttft_p99": ttft_ms / 1000, "tbt_p99": tbt_ms / 1000, "offline_tokens_per_s": offline}


ONLINE_ONLY = [run(100, 20), run(112, 21), run(106, 20.5)]
ABSOLUTE = {"ttft_p99": 0.4, "tbt_p99": 0.1}


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


def cell(baseline: list[dict[str, float]], floor: list[dict[str, float]] | None = None, searched: float = 4) -> dict:
    runs = {
        "online-only": ONLINE_ONLY,
        "hygen": [run(104, 20, 3000), run(110, 21, 3300), run(108, 20, 3000)],
        bench.BASELINE: baseline,
    }
    if floor is not None:
        runs[bench.BASELINE_FLOOR] = floor
    return {
        "targets_s": seed_judge.slo_targets(ONLINE_ONLY),
        "tolerance": seed_judge.tolerance(ONLINE_ONLY),
        "runs": runs,
        "search": {bench.BASELINE: {"value": searched}},
    }


MISSED = [run(400, 20, 9000), run(105, 20, 9000), run(380, 30, 9000)]
MET = [run(105, 20, 1000), run(108, 21, 1100), run(109, 20, 1200)]
# One line in flight: a trickle of offline work, and still over the SLO.
FLOOR_MISSED = [run(400, 20, 200), run(105, 20, 200), run(380, 30, 200)]


def over(judged_cell: dict) -> dict:
    return bench.judged(judged_cell, ABSOLUTE, bench.COMMITTED, floor=1)["over_baseline"]["hygen"]


def goal_met(judged_cell: dict) -> bool:
    return bench.goals([{**judged_cell, "judged": bench.judged(judged_cell, ABSOLUTE, bench.COMMITTED, floor=1)}])[
        "hygen"
    ]["met"]


def test_the_judge_refuses_a_baseline_that_misses_the_slo() -> None:
    """The searched baseline moved 9,000 tok/s but broke the SLO: its throughput never counts. It is
    scored at its floor's run where that met the SLO, 0 where the floor missed too (HyGen, SLO
    met with offline work, then beats it unboundedly), and refused with no ratio where the floor
    did not run. Met, the searched baseline is the yardstick."""
    assert over(cell(MET)) == {"ratio": 2.82, "why": ""} and goal_met(cell(MET))

    at_floor = over(cell(MISSED, floor=MET))
    assert at_floor["ratio"] == 2.82 and at_floor["why"].endswith("scored at its floor")

    zero = over(cell(MISSED, floor=FLOOR_MISSED))
    assert zero["ratio"] is None and zero["unbounded"] and zero["why"].startswith("baseline scored 0")
    assert goal_met(cell(MISSED, floor=FLOOR_MISSED))

    refused = over(cell(MISSED))
    assert refused["ratio"] is None and not refused.get("unbounded")
    assert refused["why"].startswith("baseline refused: searched sglang-priority-searched met the SLO on 1 of 3")
    assert not goal_met(cell(MISSED))


def test_a_baseline_searched_down_to_its_floor_is_scored_by_its_own_runs() -> None:
    """A searched value at the floor is the floor's run: missed there, the baseline scores 0; a mode
    that missed the SLO scores 0 and does not beat it; one that met it with less offline work than
    the floor moved missing it does not either."""
    at_floor = cell(FLOOR_MISSED, searched=1)
    assert over(at_floor)["unbounded"] and goal_met(at_floor)
    mode_missed = {**at_floor, "runs": {**at_floor["runs"], "hygen": [run(900, 90, 5000)] * 3}}
    assert over(mode_missed) == {"ratio": 0.0, "why": "hygen met the SLO on 0 of 3 seeds"}
    assert not goal_met(mode_missed)
    trickle = {**at_floor, "runs": {**at_floor["runs"], "hygen": [run(104, 20, 5.0)] * 3}}
    assert not over(trickle)["unbounded"] and not goal_met(trickle)
    assert "moving 200 offline tok/s" in over(trickle)["why"]


def test_the_floor_runs_only_where_the_searched_baseline_missed_above_it() -> None:
    assert bench.needs_floor(cell(MISSED), 1)
    assert not bench.needs_floor(cell(MET), 1)
    assert not bench.needs_floor(cell(MISSED, searched=1), 1)
    assert not bench.needs_floor(cell(MISSED, floor=MISSED), 1)


def test_bros_is_held_to_the_best_priority_run_that_attains_the_absolute_slo() -> None:
    """BROS's goal is BROS with its deadlines at the absolute SLO against SGLang's priority
    scheduling at the same attainment: among every concurrency either priority search tried, the
    best that attained it. A faster try that missed it does not count; BROS tuned to the load's
    tighter targets is not what is judged; a BROS that missed it on 2 of 3 seeds misses the goal."""
    trials = [{"value": 8, **run(900, 40, 5000)}, {"value": 2, **run(300, 40, 1000)}, {"value": 1, **run(200, 30, 600)}]
    base = cell([run(250, 30, 700), run(260, 31, 650), run(240, 29, 750)])
    bros = [run(350, 90, 1400), run(390, 95, 1300), run(380, 99, 1200)]
    attaining = {
        **base,
        "search": {bench.BASELINE: {"trials": trials[2:]}, bench.BASELINE_AT_SLO: {"trials": trials}},
        "runs": {**base["runs"], bench.BASELINE_AT_SLO: base["runs"][bench.BASELINE], bench.BROS_AT_SLO: bros,
                 "bros": [run(40, 9, 9000)] * 3},
    }
    goal = bench.bros_goal([{**attaining, "share": 0.3}], ABSOLUTE, bench.COMMITTED)
    assert goal is not None and goal["loads"][0]["priority_best_attaining_tokens_per_s"] == 1000
    assert goal["loads"][0]["ratio"] == 1.3 and goal["met"]
    verdicts = bench.judged(attaining, ABSOLUTE, bench.COMMITTED)["verdicts"]
    assert verdicts[bench.BROS_AT_SLO]["met"], "judged against the absolute SLO, not the load's targets"
    assert bench.BROS_AT_SLO not in bench.judged(attaining, ABSOLUTE, bench.COMMITTED)["over_baseline"]

    missing = {**attaining, "runs": {**attaining["runs"], bench.BROS_AT_SLO: [run(450, 90, 9000), run(390, 120, 9000),
                                                                            run(380, 99, 9000)]}}
    assert not bench.bros_goal([{**missing, "share": 0.3}], ABSOLUTE, bench.COMMITTED)["met"]
    without = {**attaining, "runs": {key: runs for key, runs in attaining["runs"].items() if key != bench.BROS_AT_SLO}}
    assert bench.bros_goal([{**without, "share": 0.3}], ABSOLUTE, bench.COMMITTED) is None


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


def test_trials_another_search_measured_are_judged_again_not_run_again() -> None:
    """The priority baseline searched against the absolute SLO reuses the trials its search against
    the load's targets ran on the same server and trace: only values neither tried run."""
    evaluated: list[float] = []
    known = [{"value": 0.064, "ttft_p99": 0.064, "tbt_p99": 0.064, "offline_tokens_per_s": 64.0},
             {"value": 0.008, "ttft_p99": 0.008, "tbt_p99": 0.008, "offline_tokens_per_s": 8.0}]

    found = bench.search("knob", fake_engine(0.03, evaluated), {"ttft_p99": 0.03}, 0.0, 0.008, 0.064, 1.2, known=known)

    assert 0.008 not in evaluated and 0.064 not in evaluated and evaluated
    assert found["met"] and 0.03 / 1.2 <= found["value"] <= 0.03
    assert [trial["value"] for trial in found["trials"]] == [0.064, 0.008, *evaluated]


def test_a_resumed_report_must_have_been_run_with_these_settings(tmp_path) -> None:
    """`--resume` goes on with a report only where the new runs would be one experiment with its
    own: the same settings and loads; what it ran (modes, baselines) may differ."""
    header = {"requests": 1000, "seeds": 3, "modes": ["hygen"], "baselines": [],
              "latency_fit": {"hygen": 0.04151151332014524}}
    out = tmp_path / "report.json"
    with pytest.raises(SystemExit, match="no report"):
        bench.resumed(out, header, [0.3])
    stored = {**header, "latency_fit": {"hygen": 0.041511513320145355}}  # another machine's BLAS
    out.write_text(json.dumps({**stored, "modes": ["echo"], "cells": [{"share": 0.3}]}))

    assert bench.resumed(out, header, [0.3])["modes"] == ["echo"]
    with pytest.raises(SystemExit, match=r"other settings \(requests\)"):
        bench.resumed(out, {**header, "requests": 2000}, [0.3])
    with pytest.raises(SystemExit, match=r"other settings \(loads\)"):
        bench.resumed(out, header, [0.3, 0.6])
