"""The co-location simulator bench's plumbing on a tiny setup: the rate-searched priority baseline
meets the SLO it was searched for, the targets are computed from the runs, the load picker's
utilisations are what it claims, and BROS on the co-location workload reports the same things.

Synthetic requests (no tokenizer), Llama-3.1-8B / H100 iteration times, a 20 s trace: every
figure compared is simulated time, deterministic for a seed.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from bench import colocation_judge as judge
from bench import colocation_sim as bench
from bench.load_picker import pick_rate
from sgl_blend.core.bros.cost import IterationCost, SwapModel
from sgl_blend.core.bros.requests import SLO as RealtimeSLO
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.slo_search import SLO, steps_for, violations
from sgl_blend.sim.bros_colocation import ClockDevice, run_bros
from sgl_blend.sim.bros_device import H100_H2D_SAMPLES
from sgl_blend.sim.bros_engine import SimSettings
from sgl_blend.forward_time.overlap import overlap_function
from sgl_blend.forward_time.step_time import NoisyClock, StepTime, fit_latency
from sgl_blend.sim.workload import SimRequest, chain_hash
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings

DURATION_S = 20.0


@pytest.fixture(scope="module")
def setup() -> bench.Setup:
    args = bench.parse_args(["--duration", str(DURATION_S), "--offline-n", "400", "--resolution", "2.0"])
    cost = CostModel(model_spec(args.model), HardwareSpec.resolve(args.hardware))
    step = StepTime.of(cost, overlap_function(args.overlap))
    fit = fit_latency(NoisyClock(step, args.jitter, seed=1), count=200)
    rng = random.Random(0)
    online = [SimRequest(f"on-{i}", "online", (), rng.randint(50, 900), rng.randint(20, 200), 4096, False)
              for i in range(50)]
    systems = [(chain_hash("", f"system-{k}"), 200) for k in range(4)]
    offline = [SimRequest(f"off-{i}", "offline", (systems[i % 4],), rng.randint(20, 600), rng.randint(1, 100), 512,
                          False) for i in range(args.offline_n)]
    swap = SwapModel.fit(H100_H2D_SAMPLES, cost.model.kv_bytes_per_token)
    return bench.Setup(args, cost, step, fit.models[fit.best_form()].to_dict(), fit.models["bros"], swap, online,
                       offline)


def test_the_rate_searched_priority_baseline_meets_the_slo_it_was_searched_for(setup: bench.Setup) -> None:
    tune = bench.online_arrivals(setup, "poisson", 1.0, bench.TUNE_SEED)
    reference = bench.run_config(setup, tune, "online-only", None, bench.TUNE_SEED, None)
    slos = [SLO(metric, reference[metric]) for metric in setup.args.slo]
    search = bench.searched(setup, tune, judge.BASELINE, slos, reference)
    assert search["met"] and search["steps"] == steps_for(setup.args.low_rate, setup.args.high_rate, 2.0)
    chosen = next(trial for trial in search["trials"] if trial["value"] == search["value"])
    assert chosen["offline_tokens_per_s"] > 0
    again = bench.run_config(setup, tune, judge.BASELINE, search["value"], bench.TUNE_SEED, reference)
    assert not violations(again, slos, setup.args.tolerance)
    assert again["offline_tokens_per_s"] == chosen["offline_tokens_per_s"]
    # The unbounded priority run, the same engine with the whole pool released, breaks the SLO.
    unbounded = bench.run_config(setup, tune, "sglang-priority-unbounded", None, bench.TUNE_SEED, None)
    assert violations(unbounded, slos, setup.args.tolerance)
    assert unbounded["offline_tokens_per_s"] > chosen["offline_tokens_per_s"]


def test_the_simulated_hygen_budgets_by_online_state_around_the_online_only_iteration(setup: bench.Setup) -> None:
    """The searched knob is a headroom over the predicted online-only iteration: 0.1 ms of it still
    runs offline work (an absolute 0.1 ms budget runs none), and an unbounded one (1 s) is kept to
    the TBT target while online requests decode, so P99 TBT stays within 20% of online-only's (an
    absolute 1 s budget doubled it) while offline work runs at least as fast."""
    tune = bench.online_arrivals(setup, "poisson", 1.0, bench.TUNE_SEED)
    reference = bench.run_config(setup, tune, "online-only", None, bench.TUNE_SEED, None)
    tight = bench.run_config(setup, tune, "hygen", 1e-4, bench.TUNE_SEED, reference)
    unbounded = bench.run_config(setup, tune, "hygen", 1.0, bench.TUNE_SEED, reference)
    assert 0 < tight["offline_tokens_per_s"] <= unbounded["offline_tokens_per_s"]
    assert unbounded["tbt_p99"] <= 1.2 * reference["tbt_p99"]


def test_the_load_picker_reports_the_utilisation_online_only_really_has(setup: bench.Setup) -> None:
    picks = bench.pick_loads(setup, ["poisson"])
    assert [pick["target"] for pick in picks] == setup.args.targets
    for pick in picks:
        trace = bench.online_arrivals(setup, "poisson", pick["rate_per_s"], bench.EVAL_SEED)
        run = bench.run_config(setup, trace, "online-only", None, bench.EVAL_SEED, None)
        assert run["utilisation"] == pick["utilisation"]
        assert 0 < run["utilisation"] < 1
    utilisations = [pick["utilisation"] for pick in picks]
    assert utilisations == sorted(utilisations)


def test_pick_rate_bisects_toward_the_target_and_keeps_the_closest() -> None:
    pick = pick_rate(lambda rate: rate / (1 + rate), 0.4, 0.01, 100.0, steps=30, tolerance=0.01)
    assert abs(pick.utilisation - 0.4) <= 0.01 and pick.rate == pytest.approx(2 / 3, rel=0.05)
    short = pick_rate(lambda rate: rate / (1 + rate), 0.4, 0.01, 100.0, steps=2, tolerance=0.0)
    assert len(short.trials) == 2 and short.utilisation == min((u for _, u in short.trials),
                                                               key=lambda u: abs(u - 0.4))


def run(config: str, offline: float, *, violated: list[str] = (), utilisation: float = 0.3) -> dict:
    return {"offline_tokens_per_s": offline, "slos_violated": list(violated), "utilisation": utilisation,
            "pool_exhausted": False}


def cell(rate: float, tokens: dict[str, float], violated: dict[str, list[str]] | None = None) -> dict:
    runs = {config: run(config, tokens.get(config, 0.0), violated=(violated or {}).get(config, []))
            for config in judge.CONFIGS}
    return {"pattern": "poisson", "rate_per_s": rate, "target_utilisation": rate, "runs": runs,
            "search": {config: {"trials": []} for config in judge.SEARCHED}}


def with_latencies(cell: dict) -> dict:
    """``cell`` with every run's latencies set (10 ms), as the table reads them."""
    return {**cell, "runs": {config: {**run, **dict.fromkeys(judge.LATENCIES, 0.01)}
                             for config, run in cell["runs"].items()}}


def test_targets_are_computed_from_the_runs() -> None:
    cells = [cell(0.2, {"hygen": 300, "echo": 100, "bros": 0, judge.BASELINE: 200}),
             cell(0.5, {"hygen": 10, "echo": 500, "bros": 50, judge.BASELINE: 100}, {"echo": ["tbt_p99"]})]
    goal = judge.targets(cells)
    assert goal["over_baseline_at_lowest_load"] == {"hygen": {"poisson@0.2": 1.5}, "echo": {"poisson@0.2": 0.5},
                                                    "bros": {"poisson@0.2": 0.0}}
    assert goal["at_least_1.3x"] == {"hygen": True, "echo": False, "bros": False}
    assert goal["slos_met"]["echo"] == {"poisson@0.2": True, "poisson@0.5": False}
    assert goal["goal_met"] == {"hygen": True, "echo": False, "bros": False}
    assert goal["loads_within_20_60"] and goal["online_only_utilisation"] == {"poisson@0.2": 0.3, "poisson@0.5": 0.3}
    # A baseline that ran no offline work is beaten by any mode that did, and by none that did not.
    idle = judge.targets([cell(0.2, {"hygen": 5, "echo": 0})])
    assert idle["over_baseline_at_lowest_load"]["hygen"] == {"poisson@0.2": None}
    assert idle["at_least_1.3x"]["hygen"] and not idle["at_least_1.3x"]["echo"]
    rows = judge.table([with_latencies(cells[0])])
    assert {row["config"]: row["over_baseline"] for row in rows}["hygen"] == 1.5


def test_the_judge_refuses_a_baseline_that_misses_the_slo() -> None:
    """The priority baseline moved 1,000 tok/s but broke P99 TBT: it scores 0, so HyGen's 300 tok/s
    (SLO met) is not 0.3x of it but beats it; a failed baseline run scores 0 as well. Met, the
    same baseline is the yardstick again."""
    missed = cell(0.2, {"hygen": 300, "echo": 0, judge.BASELINE: 1000}, {judge.BASELINE: ["tbt_p99"]})
    goal = judge.targets([missed])
    assert goal["over_baseline_at_lowest_load"]["hygen"] == {"poisson@0.2": None}
    assert goal["goal_met"] == {"hygen": True, "echo": False, "bros": False}
    assert {row["config"]: row["over_baseline"] for row in judge.table([with_latencies(missed)])}["hygen"] is None
    failed = cell(0.2, {"hygen": 300, judge.BASELINE: 1000})
    failed["runs"][judge.BASELINE]["failed"] = "server died"
    assert judge.targets([failed])["goal_met"]["hygen"]
    met = judge.targets([cell(0.2, {"hygen": 300, judge.BASELINE: 1000})])
    assert met["over_baseline_at_lowest_load"]["hygen"] == {"poisson@0.2": 0.3} and not met["goal_met"]["hygen"]


def test_both_benches_refuse_deadlines_below_what_online_only_achieves() -> None:
    """Echo's and BROS's deadlines are k times online-only's P99s: a k below 1 is refused when typed,
    and the searches start at 1, but for Echo's on the emulated engine, which starts where its TPOT
    deadline is the device's smallest iteration: no iteration is shorter, and at k = 1 Echo fills
    every iteration up to online-only's P99."""
    from bench import colocation_emulated, colocation_sim_check

    for parse in (bench.parse_args, colocation_emulated.parse_args):
        args = parse([])
        assert args.low_bros_scale == 1.0
        for flag in ("--low-echo-scale", "--low-bros-scale", "--high-scale"):
            with pytest.raises(SystemExit):
                parse([flag, "0.5"])
    assert bench.parse_args([]).low_echo_scale == 1.0

    targets = {"ttft_p99": 0.045, "tbt_p99": 0.012}
    low, high = colocation_sim_check.knob_range(colocation_emulated.parse_args([]), "echo", targets)
    assert low == pytest.approx(colocation_emulated.smallest_iteration_s() / 0.012) and 0.3 < low < 1
    assert colocation_emulated.slo_scaled(low, targets)["tpot_slo_s"] == pytest.approx(
        colocation_emulated.smallest_iteration_s()
    )
    given = colocation_emulated.parse_args(["--low-echo-scale", "1.5"])
    assert colocation_sim_check.knob_range(given, "echo", targets) == (1.5, high)


def test_bros_at_the_slo_searches_its_deadlines_only_below_the_slo_it_is_judged_at() -> None:
    """bros-at-slo plans to k times the absolute SLO, k searched up to 1: a lowest k above 1 (planning
    past the SLO) or at 0 is refused, and k = 1 alone is the paper's BROS, not searched."""
    from bench import colocation_emulated

    assert colocation_emulated.parse_args([]).low_bros_at_slo_scale == colocation_emulated.AT_SLO_LOW_SCALE < 1
    assert colocation_emulated.parse_args(["--low-bros-at-slo-scale", "1"]).low_bros_at_slo_scale == 1.0
    for value in ("1.5", "0"):
        with pytest.raises(SystemExit):
            colocation_emulated.parse_args(["--low-bros-at-slo-scale", value])
    assert colocation_emulated.slo_scaled(0.5, {"ttft_p99": 0.4, "tbt_p99": 0.1}) == {
        "ttft_slo_s": 0.2, "tpot_slo_s": 0.05, "idle_budget_s": 0.05}


def test_a_configuration_run_again_replaces_its_runs_but_not_the_targets() -> None:
    """`--rejudge --merge`: the rerun's BROS runs and search replace the report's at the load both
    measured; the report's online-only runs (its targets) stay, and a load only the rerun measured
    is not added."""
    from pathlib import Path

    from bench import colocation_emulated

    def runs(tokens: float) -> list[dict]:
        return [{"offline_tokens_per_s": tokens}]

    report = {"cells": [{"share": 0.3, "runs": {"online-only": runs(0), "bros": runs(141), "hygen": runs(3000)},
                         "search": {"bros": {"value": 1.0}}}]}
    rerun = {"cells": [{"share": 0.3, "runs": {"online-only": runs(-1), "bros": runs(6000)},
                        "search": {"bros": {"value": 2.0}}},
                       {"share": 0.6, "runs": {"bros": runs(5000)}, "search": {}}]}
    colocation_emulated.merge(report, rerun, Path("rerun.json"))
    (cell,) = report["cells"]
    assert cell["runs"] == {"online-only": runs(0), "bros": runs(6000), "hygen": runs(3000)}
    assert cell["search"]["bros"]["value"] == 2.0 and report["merged"] == {"bros": "rerun.json"}


def test_parts_run_at_other_seeds_join_into_one_experiment_judged_on_every_seed() -> None:
    """`--rejudge --join`: a part run at other seeds adds its runs, online-only's included, and the
    targets and tolerance come from every online-only run; a part run with other settings, at seeds
    the report has, or at other loads is refused."""
    from pathlib import Path

    from bench import colocation_emulated, seed_judge

    def part(first_seed: int, ttft: float, tokens: float) -> dict:
        online = {"ttft_p99": ttft, "tbt_p99": 0.02, "offline_tokens_per_s": 0.0, "seed": first_seed}
        bros = {"ttft_p99": 0.3, "tbt_p99": 0.05, "offline_tokens_per_s": tokens, "seed": first_seed}
        return {"requests": 1000, "seeds": 1, "first_seed": first_seed, "wall_s": 400.0 + first_seed,
                "capacity_slo_s": {"ttft_p99": 0.4, "tbt_p99": 0.1},
                "cells": [{"share": 0.3, "runs": {"online-only": [online], "bros-at-slo": [bros]},
                           "search": {"bros-at-slo": {"value": 1.0, "met": None, "binding": [], "trials": []}},
                           "targets_s": {"ttft_p99": ttft, "tbt_p99": 0.02}, "tolerance": 0.0}]}

    report = part(1, 0.040, 1000.0)
    for first_seed, ttft, tokens in ((2, 0.050, 1200.0), (3, 0.060, 1100.0)):
        colocation_emulated.join(report, part(first_seed, ttft, tokens), Path(f"part{first_seed}.json"))
    (cell,) = report["cells"]
    online = cell["runs"]["online-only"]
    assert [run["seed"] for run in online] == [1, 2, 3]
    assert [run["offline_tokens_per_s"] for run in cell["runs"]["bros-at-slo"]] == [1000.0, 1200.0, 1100.0]
    assert cell["targets_s"] == seed_judge.slo_targets(online) and cell["targets_s"]["ttft_p99"] == 0.050
    assert cell["tolerance"] == seed_judge.tolerance(online) > 0
    assert report["seeds"] == 3 and [joined["first_seed"] for joined in report["joined"]] == [2, 3]

    with pytest.raises(SystemExit, match=r"other settings \(requests\)"):
        colocation_emulated.join(report, {**part(4, 0.05, 1.0), "requests": 2000}, Path("other.json"))
    with pytest.raises(SystemExit, match="seeds the report has"):
        colocation_emulated.join(report, part(2, 0.05, 1.0), Path("again.json"))
    with pytest.raises(SystemExit, match="other loads"):
        colocation_emulated.join(report, {**part(4, 0.05, 1.0), "cells": []}, Path("loads.json"))
    assert report["seeds"] == 3


def test_the_judge_scores_the_offline_tokens_the_engine_decoded_in_the_window(tmp_path) -> None:
    """A policy decoding many lines at once finishes few long ones within a replay: on committed
    tokens it loses, on the tokens the engine decoded in the window (its iteration records) it
    wins. A report from before the decoded figure is judged on it from the records its servers
    left; a run its server's records do not cover refuses the rejudge."""
    import json

    from bench import colocation_emulated as judge

    def run(started: float, committed: float) -> dict:
        return {"started_wall": started, "window_s": 10.0, "ttft_p99": 0.3, "tbt_p99": 0.09,
                "offline_tokens_per_s": committed}

    bros = [run(100.0 + 20 * seed, 2000.0) for seed in range(3)]
    priority = [run(200.0 + 20 * seed, 2500.0) for seed in range(3)]
    trial = {"value": 16.0, **run(300.0, 2600.0)}
    report = {"capacity_slo_s": {"ttft_p99": 0.4, "tbt_p99": 0.1}, "capacity": {"value": 41.5, "met": True},
              "cells": [{"share": 0.3, "rate_per_s": 12.45, "seed_spread": {},
                         "targets_s": {"ttft_p99": 0.05, "tbt_p99": 0.013}, "tolerance": 0.5,
                         "runs": {"online-only": [run(50.0, 0.0)], judge.BROS_AT_SLO: bros,
                                  judge.BASELINE_AT_SLO: priority},
                         "search": {judge.BROS_AT_SLO: {"value": 1.0, "met": True, "trials": []},
                                    judge.BASELINE_AT_SLO: {"value": 64.0, "met": True, "trials": [trial]}}}]}
    work = tmp_path / "report-work"
    work.mkdir()

    def write_records(config: str, value: float, starts: list[float], per_batch: int) -> None:
        records = [{"wall": start + 0.5 * tick, "offline_decode": per_batch} for start in starts for tick in range(20)]
        records.append({"wall": starts[-1] + 30.0, "offline_decode": 10**6})  # after every window
        path = work / judge.record_file(config, 0.3, value)
        path.write_text("".join(json.dumps(record) + "\n" for record in records))

    write_records(judge.BROS_AT_SLO, 1.0, [r["started_wall"] for r in bros], 250)  # 500 tok/s a window
    write_records(judge.BASELINE_AT_SLO, 64.0, [r["started_wall"] for r in priority], 180)
    committed = judge.write_report(json.loads(json.dumps(report)), tmp_path / "committed.json")
    assert committed["goals"]["bros"]["loads"][0]["ratio"] == round(2000 / 2600, 3)

    with pytest.raises(SystemExit, match="holds no records"):
        judge.decoded_from_records(json.loads(json.dumps(report)), work)
    write_records(judge.BASELINE_AT_SLO, 16.0, [trial["started_wall"]], 200)
    judge.decoded_from_records(report, work)
    assert [r[judge.DECODED] for r in bros] == [500.0] * 3 and trial[judge.DECODED] == 400.0
    decoded = judge.write_report(report, tmp_path / "decoded.json")
    (load,) = decoded["goals"]["bros"]["loads"]
    assert (load["bros_tokens_per_s"], load["priority_best_attaining_tokens_per_s"]) == (500.0, 400.0)
    assert load["ratio"] == 1.25 and not decoded["goals"]["bros"]["met"]
    assert "offline tok/s (decoded) | committed tok/s" in judge.markdown(decoded)


def test_bros_keeps_the_radix_cache_only_when_asked(setup: bench.Setup) -> None:
    """`--bros-radix-cache` drops only BROS's `--disable-radix-cache`; other modes' flags stay."""
    from bench import colocation_emulated

    model = setup.latency_model
    bros = PluginSettings(offline_policy=OFF, colocation=ColocationConfig(mode="bros", latency_model=model))
    hygen = PluginSettings(offline_policy="psm", colocation=ColocationConfig(mode="hygen", latency_model=model))
    default = colocation_emulated.parse_args([])
    asked = colocation_emulated.parse_args(["--bros-radix-cache"])
    assert "--disable-radix-cache" in colocation_emulated.server_args(default, bros, ["--port", "1"])
    kept = colocation_emulated.server_args(asked, bros, ["--port", "1"])
    assert "--disable-radix-cache" not in kept and kept[:2] == ["--port", "1"]
    assert colocation_emulated.server_args(asked, hygen, []) == colocation_emulated.server_args(default, hygen, [])


def test_bros_on_the_colocation_workload_serves_every_online_request_and_counts_offline_once(
        setup: bench.Setup) -> None:
    arrivals = bench.online_arrivals(setup, "poisson", 1.0, bench.EVAL_SEED)
    offline = setup.offline[:30]  # few enough that all of them finish within the trace
    device = ClockDevice(NoisyClock(setup.step, 0.0), setup.swap)
    settings = SimSettings(kv_tokens=setup.cost.kv_capacity_tokens(), max_running=64, prefill_token_budget=512,
                           be_concurrency=64, slo=RealtimeSLO(0.05, 0.01))
    result = run_bros(arrivals, offline, device, IterationCost(setup.bros_model, setup.swap), settings, DURATION_S)
    assert [timing.tokens for timing in result.online] == [arrival.request.output_len for arrival in arrivals]
    assert all(timing.ttft is not None and timing.ttft >= 0 for timing in result.online)
    # Taken in at the loop's next iteration: some wait for the one under way, none past their token.
    assert all(0 <= timing.received < timing.ttft for timing in result.online)
    assert any(timing.received > 0 for timing in result.online)
    assert result.seconds >= DURATION_S and 0 < device.busy_s <= result.seconds
    # Every offline request finished: its prompt and its output counted exactly once.
    assert result.counts["offline_finished"] == len(offline)
    assert sum(tokens for _, tokens in result.offline_events) == sum(r.prompt_len + r.output_len for r in offline)
    assert sum(tokens for _, tokens in result.offline_output_events) == sum(r.output_len for r in offline)


@pytest.mark.parametrize("idle_s", [math.inf, 0.004], ids=["whole", "chunked"])
def test_bros_with_the_radix_cache_prefills_a_shared_segment_once(setup: bench.Setup, idle_s: float) -> None:
    """Four BE lines sharing a 400-token segment: without the radix cache every prefill computes
    it; with it only the first line's does, the rest computing their own tails on top of it, and
    every line still gets its whole output. A plan that chunks the prompts (a short idle budget)
    starts a later line's first chunk past the segment, as SGLang's adder does after its match."""

    class PrefillTokens:
        """The emulated device's clock, counting what each prefill computes and attends."""

        def __init__(self) -> None:
            self.chunks: list[tuple[int, int]] = []

        def measure(self, shape) -> float:
            self.chunks.extend(shape.prefill_chunks)
            return setup.step.seconds(shape)

    shared = (chain_hash("", "rubric"), 400)
    offline = [SimRequest(f"off-{i}", "offline", (shared,), 50, 8, 8, True) for i in range(4)]
    settings = SimSettings(kv_tokens=100_000, max_running=8, prefill_token_budget=450, be_concurrency=8,
                           slo=RealtimeSLO(idle_s=idle_s))
    computed = {}
    for radix_cache in (False, True):
        clock = PrefillTokens()
        result = run_bros([], offline, ClockDevice(clock, setup.swap), IterationCost(setup.bros_model, setup.swap),
                          settings, 1.0, radix_cache=radix_cache)
        assert sum(tokens for _, tokens in result.offline_output_events) == 4 * 8
        computed[radix_cache] = clock.chunks
    assert sum(extend for extend, _ in computed[False]) == 4 * 450
    if idle_s == math.inf:
        assert sorted(computed[False]) == [(450, 0)] * 4
        assert sorted(computed[True]) == [(50, 400)] * 3 + [(450, 0)]
    else:
        assert len(computed[False]) > 4  # the plan chunked the prompts
        # The second line's first chunk ran before the first line had its first token, so it
        # computed the segment too; the last two started past it, 50 tokens each, chunked or not.
        assert sum(extend for extend, _ in computed[True]) == 2 * 450 + 2 * 50
        assert computed[True][-1] == (50, 400) and (7, 443) in computed[True]


def test_steps_for_a_resolution() -> None:
    assert steps_for(1.0, 1.2, 1.25) == 0
    assert steps_for(1.0, 2.0, 1.25) == 2  # 2 -> 1.41 -> 1.19
    assert steps_for(0.02, 10.0, 1.25) == 5  # 500 -> 22 -> 4.7 -> 2.2 -> 1.48 -> 1.22
    with pytest.raises(ValueError, match="resolution > 1"):
        steps_for(1.0, 2.0, 1.0)


def test_the_cpu_bench_reads_utilisation_from_the_schedulers_records(tmp_path) -> None:
    from bench.colocation import Engine

    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps({"iteration": i, "forward_s": 0.1, "wall": 100.0 + i}) + "\n"
                               for i in range(10)))
    engine = Engine(server=None, records=records)
    assert engine.busy_s(102.0, 105.0) == pytest.approx(0.4)  # the batches that ended at 102..105
    assert engine.busy_s(200.0, 300.0) == 0.0
    assert Engine(server=None, records=tmp_path / "none.jsonl").busy_s(0.0, 1.0) == 0.0


def test_the_cpu_bench_waits_for_the_previous_trials_batches_to_stop(tmp_path) -> None:
    import time

    from bench.colocation import Engine

    records = tmp_path / "records.jsonl"
    engine = Engine(server=None, records=records)
    assert engine.last_batch_at() is None and engine.wait_idle(1.0, 5.0) < 1.0
    records.write_text(json.dumps({"forward_s": 0.1, "wall": time.time()}) + "\n")
    assert engine.wait_idle(0.2, 5.0) >= 0.1  # the last batch ended just now: it waits for the quiet time
    records.write_text(json.dumps({"forward_s": 0.1, "wall": time.time() - 10}) + "\n")
    assert engine.wait_idle(1.0, 5.0) < 0.5


def test_the_judges_simulator_tunes_a_mode_against_the_loads_targets() -> None:
    """The emulated judge's first step (``--sim-first``): its engine in the simulator searches
    HyGen's budget on a tuning trace. A generous target is met at the top of the range; one no
    run can meet leaves the floor, not met. bros-at-slo is BROS searched in its own range."""
    from bench import colocation_emulated
    from bench.colocation import online_trace, sharegpt_prompts
    from bench.colocation_sim_check import Simulator

    args = colocation_emulated.parse_args(["--offline-lines", "300"])
    simulator = Simulator.of(args, *colocation_emulated.latency_fit(args))
    prompts = sharegpt_prompts(200, 0, max_chars=4000, max_tokens_cap=256)
    arrivals = simulator.arrivals(online_trace("poisson", 12.0, 5.0, 5.0, prompts, 200))

    generous = simulator.tune("hygen", "generous", {"ttft_p99": 10.0, "tbt_p99": 10.0}, 0.0, arrivals)
    unreachable = simulator.tune("hygen", "unreachable", {"ttft_p99": 1e-6, "tbt_p99": 1e-6}, 0.0, arrivals)

    assert (generous["value"], generous["met"]) == (0.064, True)
    floor = colocation_emulated.smallest_iteration_s()
    assert (unreachable["value"], unreachable["met"]) == (pytest.approx(floor), False)
    assert unreachable["tried"] == [0.064, pytest.approx(floor)]
    # BROS at the absolute SLO searches BROS's deadlines in its own range, k up to 1.
    at_slo = simulator.tune(colocation_emulated.BROS_AT_SLO, "at-slo", {"ttft_p99": 1e-6, "tbt_p99": 1e-6}, 0.0,
                            arrivals)
    assert at_slo["tried"] == [1.0, colocation_emulated.AT_SLO_LOW_SCALE] and not at_slo["met"]


def test_the_sim_check_reads_the_engines_part_of_a_replay_from_its_records() -> None:
    """A replay started at wall 1000.0 for 2 s, three online requests: offline decodes per second,
    the scheduler's time from each request's receipt to the batch that completed its prompt (a
    later one for a chunked prompt), the engine's periods per online token; a batch outside the
    window counts for nothing, and records that hold other than the replay's first tokens are
    refused."""
    from bench.colocation_sim_check import emulated_figures
    from sgl_blend.sim.colocation import OnlineArrival

    run = {"started_wall": 1000.0, "window_s": 2.0, "ttft_p99": 0.1, "tbt_p99": 0.02, "offline_tokens_per_s": 9.0}
    records = [
        {"wall": 999.5, "offline_decode": 50, "online_prefilled": [999.4]},  # the previous replay's
        {"wall": 1000.02, "offline_decode": 10, "online_prefilled": [1000.01], "online_decode": 0},
        {"wall": 1001.31, "offline_decode": 30, "online_prefilled": [1001.21, 1001.3], "online_decode": 0},
        {"wall": 1001.9, "offline_decode": 20, "online_decode": 2, "period_s": 0.012},
    ]
    records = [{**record, "forward_s": 0.001} for record in records]  # equal forwards: gaps are periods
    trace = [OnlineArrival(at, SimRequest(f"on-{at}", "online", (), 10, 5, 5, True)) for at in (0.0, 1.2, 1.3)]
    (figures,) = emulated_figures([run], records, [trace])
    assert figures["engine_offline_tokens_per_s"] == 30.0 and figures["offline_tokens_per_s"] == 9.0
    assert figures["scheduler_ttft_p99"] == pytest.approx(0.01 + 0.98 * (0.1 - 0.01))
    assert figures["engine_tbt_p99"] == pytest.approx(0.012)
    with pytest.raises(ValueError, match="hold 3 first tokens, it sent 2 requests"):
        emulated_figures([run], records, [trace[:2]])


def test_the_sim_check_starts_the_batch_where_the_engine_started_it() -> None:
    """The replay at wall 40 followed an idle spell (the previous trial's batch cancelled, ending at
    10.5) and the new batch's first iteration at 13: the simulated batch runs 27 s before the
    trace. Without an idle spell the records' first iteration starts it. An idle spell that lasts
    into the replay (a batch that had answered nothing yet) gives none, as do no records."""
    from bench.colocation_sim_check import offline_lead_s

    run = {"started_wall": 40.0, "window_s": 5.0}
    walls = [10.0, 10.5, 13.0, 13.4, 14.0, *range(15, 45)]
    assert offline_lead_s([{"wall": float(wall)} for wall in walls], run) == pytest.approx(27.0)
    assert offline_lead_s([{"wall": float(wall)} for wall in walls[2:]], run) == pytest.approx(27.0)
    assert offline_lead_s([{"wall": wall} for wall in (10.0, 10.5, 40.2, 40.3)], run) == 0.0
    assert offline_lead_s([{"wall": 41.0}], run) == 0.0
    assert offline_lead_s([], run) == 0.0


def test_the_engines_token_gaps_run_from_end_to_end_once_per_online_decode() -> None:
    """Two online decodes in a batch are two tokens that came that long after the batch before's:
    its period (launch to launch) plus its forward less the one before's, so a long forward is its
    own batch's gap, not the next one's. A batch after an idle spell has no period, and one
    without online decodes adds no online token."""
    from bench.colocation_sim_check import engine_token_gaps

    records = [{"forward_s": 0.004, "online_decode": 1}, {"period_s": 0.005, "forward_s": 0.012, "online_decode": 2},
               {"forward_s": 0.004, "online_decode": 3}, {"period_s": 0.02, "forward_s": 0.004, "online_decode": 0},
               {"period_s": 0.006, "forward_s": 0.005, "online_decode": 1}]
    assert engine_token_gaps(records) == pytest.approx([0.013, 0.013, 0.007])


def test_the_same_run_check_reads_the_schedulers_first_tokens_inside_the_replay() -> None:
    """Time to first token on the scheduler runs from receipt to the batch that completed the prompt
    (``online_prefilled``), a later one for a chunked prompt; records outside the replay's window
    count for nothing."""
    from bench.colocation_same_run import emulated

    row = {"ttft_p99": 0.05, "tbt_p99": 0.02, "started_wall": 100.0, "window_s": 1.0, "requests": 2}
    records = [
        {"wall": 99.9, "offline_decode": 40, "online_prefilled": [99.0]},  # before the replay
        {"wall": 100.010, "offline_decode": 5, "online_received": [100.004], "online_prefilled": [100.004]},
        {"wall": 100.100, "offline_decode": 5, "online_received": [100.060], "online_decode": 1, "period_s": 0.02},
        {"wall": 100.140, "offline_decode": 5, "online_prefilled": [100.060], "online_decode": 1, "period_s": 0.04},
    ]
    records = [{**record, "forward_s": 0.001} for record in records]  # equal forwards: gaps are periods
    figures = emulated(row, records)
    assert figures["scheduler_ttft_p99"] == pytest.approx(0.006 + 0.99 * (0.080 - 0.006))
    assert figures["engine_tbt_p99"] == pytest.approx(0.02 + 0.99 * 0.02)
    assert figures["engine_offline_tokens_per_s"] == 15.0 and figures["ttft_p99"] == 0.05


def test_the_sim_check_flags_a_difference_over_10_percent_and_one_outside_the_seeds() -> None:
    """Emulated seeds at 100 and 140 (mean 120): a simulated 130 is within 10% (8.3%) and inside their
    range; 150 is over 10% and outside; 100 is over 10% (-16.7%) but a seed measured it."""
    from bench.colocation_sim_check import COMPARED, versus

    def figures(value: float) -> dict[str, float]:
        return dict.fromkeys(COMPARED, value)

    emulated = [figures(100.0), figures(140.0)]
    inside, above, low = (versus(emulated, [figures(value)]) for value in (130.0, 150.0, 100.0))
    assert inside["over_10_percent"] == [] and inside["outside_seed_range"] == []
    assert above["over_10_percent"] == above["outside_seed_range"] == list(COMPARED)
    assert low["over_10_percent"] == list(COMPARED) and low["outside_seed_range"] == []


def test_host_periods_compare_batches_of_online_decodes_alone_within_each_runs_replay(tmp_path) -> None:
    """Only batches of online decodes and nothing else, with a period, inside an evaluation run's
    window count; online-only's records are read from HyGen's first server, as the judge keeps them."""
    from bench import host_periods

    def record(wall: float, period: float, online: int, **extra: int) -> dict:
        return {"wall": wall, "period_s": period, "forward_s": 0.001, "online_decode": online,
                "prefill_reqs": 0, "offline_decode": 0, **extra}

    records = [
        record(100.5, 0.005, 2), record(101.0, 0.007, 9),  # online-only's replay
        record(200.5, 0.010, 2), record(201.0, 0.030, 2, offline_decode=5),  # HyGen's; the second has offline work
        record(201.5, 0.050, 3, prefill_reqs=1), record(300.0, 0.9, 2),  # a prefill; outside every window
    ]
    work = tmp_path / "report-work"
    work.mkdir()
    (work / "hygen.records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report = {"cells": [{"share": 0.3, "search": {"hygen": {"value": 0.008}}, "runs": {
        "online-only": [{"started_wall": 100.0, "window_s": 2.0}],
        "hygen": [{"started_wall": 200.0, "window_s": 2.0}],
    }}]}
    result = host_periods.measure(report, work)
    configs = result["cells"][0]["configs"]
    assert [(row["decodes_from"], row["batches"], row["period_median_s"]) for row in configs["online-only"]["rows"]] \
        == [(1, 1, 0.005), (8, 1, 0.007)]
    assert [(row["decodes_from"], row["batches"], row["period_median_s"]) for row in configs["hygen"]["rows"]] \
        == [(1, 1, 0.010)]
    assert "| 30% | hygen | 1+ | 10.0 |" in host_periods.markdown(result)


def test_the_replays_cpu_is_counted_by_role_across_the_servers_process_tree(tmp_path) -> None:
    """A stand-in server whose child calls itself SGLang's scheduler and burns 0.3 s of CPU: the
    meter gives those seconds (less a few of the kernel's 10 ms ticks) to the scheduler, not to the server or
    the detokenizer."""
    import subprocess
    import sys
    import time

    import psutil

    from bench.host_cpu import cpu_seconds

    ready = tmp_path / "burnt"
    child = ("import setproctitle, time\nsetproctitle.setproctitle('sglang::scheduler')\n"
             "while time.process_time() < 0.3: pass\n"
             f"open({str(ready)!r}, 'w').close()\ntime.sleep(60)\n")
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    server = subprocess.Popen([sys.executable, "-c", parent])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the stand-in scheduler never finished its work"
        seconds = cpu_seconds(server.pid)
    finally:
        for process in psutil.Process(server.pid).children(recursive=True):
            process.kill()
        server.kill()
        server.wait()
    assert seconds["scheduler"] >= 0.25 and seconds["detokenizer"] == 0.0, seconds  # 10 ms ticks
    assert seconds["server"] < seconds["scheduler"], seconds
