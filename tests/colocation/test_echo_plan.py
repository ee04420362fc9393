"""Echo's plan generator and selector on plain views (no engine): the controller in echo mode keeps
the last batch's decodes the deadline carries, preempts at the least punishment what memory
requires, and admits waiting offline requests by benefit minus punishment per unit of time,
never past the deadline or the offline memory."""

from __future__ import annotations

import random

import pytest

from sgl_blend.core.colocation import (
    ColocationConfig, ColocationController, IterationPlan, IterationView, RunningRequest, WaitingOnline,
)
from sgl_blend.core.echo_plan import (
    ADD_PREFILL, ADD_RESUME, CANDIDATE_WINDOW, KEEP_DECODE, PARK_DECODE, PREEMPT, OfflineCandidate,
)
from sgl_blend.core.latency_model import BatchShape, LinearLatencyModel
from sgl_blend.core.state_budget import NEAR_ZERO_FRACTION

# 1 ms per iteration, 10 µs per prefill token, 1 µs per decode context token.
MODEL = LinearLatencyModel("hygen", (1e-3, 1e-5, 1e-6, 0.0, 0.0, 0.0, 0.0))
TTFT_S, TPOT_S = 1.0, 0.05


def echo(**settings) -> ColocationController:
    return ColocationController(ColocationConfig(mode="echo", ttft_slo_s=TTFT_S, tpot_slo_s=TPOT_S,
                                                 latency_model=MODEL.to_dict(), reserve_sigmas=0.0, **settings))


def online_with_slack(slack_s: float, context: int = 100) -> RunningRequest:
    """An online decode whose deadline leaves ``slack_s`` for this iteration (at now = 10 s)."""
    return RunningRequest("online", True, context, reserved=10, arrival=10.0 + slack_s - TTFT_S, output_tokens=0)


def offline(rid: str, context: int, reserved: int = 10, shared: int = 0) -> RunningRequest:
    return RunningRequest(rid, False, context, reserved=reserved, shared=shared)


def view(running, waiting=(), kv_capacity: int = 100_000, chunk_tokens: int | None = 4096) -> IterationView:
    return IterationView(now=10.0, running=list(running), waiting_online=list(waiting), kv_capacity=kv_capacity,
                         chunk_tokens=chunk_tokens)


def test_a_candidate_on_a_resident_prefix_goes_before_a_longer_cold_one() -> None:
    """Deadline 6 ms: the online decode costs 1.1 ms; the cold 400-token prompt (4 ms) and the
    resident-prefix one (100 new tokens on 600 cached, 1 ms) do not both fit. The cold one comes
    first in the policy's order; the selector takes the one that yields 700 tokens for 1 ms."""
    controller = echo()
    plan = controller.begin(view([online_with_slack(0.006)]))
    cold = OfflineCandidate("cold", extend=400, prefix=0, max_new_tokens=8)
    warm = OfflineCandidate("warm", extend=100, prefix=600, max_new_tokens=8)
    admit = controller.choose_offline(plan, [cold, warm], truncate=False)
    assert list(admit) == ["warm"]
    assert plan.echo.summary()["benefit"] == 700
    # With room for both, both go, the resident-prefix one first.
    roomy = controller.begin(view([online_with_slack(0.5)]))
    assert list(controller.choose_offline(roomy, [cold, warm], truncate=False)) == ["warm", "cold"]


def test_a_returning_request_is_not_credited_again_for_its_own_kv() -> None:
    """A parked decode comes back as a one-token prefill on its resident KV: benefit 1 for 10 µs,
    not its whole context, so a fresh prompt (400 tokens for 3 ms) goes first."""
    controller = echo()
    plan = controller.begin(view([online_with_slack(0.5)]))
    back = OfflineCandidate("back", extend=1, prefix=900, max_new_tokens=50, fresh=False)
    fresh = OfflineCandidate("fresh", extend=300, prefix=100, max_new_tokens=8)
    admit = controller.choose_offline(plan, [back, fresh], truncate=False)
    assert list(admit) == ["fresh", "back"]
    kinds = {adjustment.rid: adjustment for adjustment in plan.echo.adjustments}
    assert kinds["back"].kind == ADD_RESUME and kinds["back"].benefit == 1
    assert kinds["fresh"].kind == ADD_PREFILL and kinds["fresh"].benefit == 400


def test_memory_for_an_online_request_is_taken_at_the_least_punishment() -> None:
    """Capacity 3000: online work needs 1210 and offline work holds 2200, 410 too many. Each
    offline request alone frees enough; "c" shares 450 of its 500 tokens with another lock, which
    keeps them resident, so preempting it recomputes 50 tokens, "a" 600 and "b" 700. HyGen would
    take the newest, "b"."""
    controller = echo()
    running = [online_with_slack(0.5), offline("a", 600, reserved=100), offline("c", 500, reserved=100, shared=450),
               offline("b", 700, reserved=200)]
    plan = controller.begin(view(running, [WaitingOnline("new", 900, 200, 9.9)], kv_capacity=3000))
    assert plan.preempt == ["c"]
    preempt = [a for a in plan.echo.adjustments if a.kind == PREEMPT]
    assert [(a.rid, a.punishment) for a in preempt] == [("c", 50)]
    assert plan.budget.offline_memory == 3000 - 1210 - (700 + 900)


def test_when_no_single_request_frees_enough_the_cheapest_per_freed_token_go_first() -> None:
    controller = echo()
    running = [online_with_slack(0.5), offline("long", 900, reserved=10), offline("young", 100, reserved=500),
               offline("mid", 400, reserved=400)]
    # offline holds 910 + 600 + 800 = 2310; online 110 + 1000; capacity 2900 -> 520 short.
    plan = controller.begin(view(running, [WaitingOnline("new", 900, 100, 9.9)], kv_capacity=2900))
    # per freed token: young 100/600, mid 400/800, long 900/910 -> young first (600 >= 520 covers it)
    assert plan.preempt == ["young"]
    plan = controller.begin(view(running, [WaitingOnline("new", 900, 100, 9.9)], kv_capacity=2500))
    # 920 short: nobody covers it alone; young (600) first, then the least punished that covers 320: mid
    assert plan.preempt == ["young", "mid"]


def test_decodes_the_deadline_cannot_carry_are_parked_most_expensive_first() -> None:
    """Deadline 5 ms: 1 ms + 0.1 ms online leaves 3.9 ms of decode context at 1 µs a token."""
    controller = echo()
    running = [online_with_slack(0.005), offline("a", 3000), offline("b", 500), offline("c", 1500), offline("d", 800)]
    plan = controller.begin(view(running))
    assert sorted(plan.park) == ["a"]
    kept = [a.rid for a in plan.echo.adjustments if a.kind == KEEP_DECODE]
    assert kept == ["b", "d", "c"]
    assert plan.budget.predicted_s() <= 0.005
    assert [a.rid for a in plan.echo.adjustments if a.kind == PARK_DECODE] == ["a"]


def test_a_truncated_chunk_is_the_last_admission_and_only_when_allowed() -> None:
    controller = echo(min_offline_chunk=8)
    long = OfflineCandidate("long", extend=1000, prefix=0, max_new_tokens=8)
    short = OfflineCandidate("short", extend=100, prefix=0, max_new_tokens=8)
    plan = controller.begin(view([online_with_slack(0.004055)]))
    # 4.055 ms - 1.1 ms: "long" does not fit whole, "short" takes 1 ms, then 1.955 ms -> 195 tokens of "long"
    admit = controller.choose_offline(plan, [long, short], truncate=True)
    assert admit == {"short": 100, "long": 195}
    assert plan.echo.summary()["truncated"] == 1
    plan = controller.begin(view([online_with_slack(0.004)]))
    assert controller.choose_offline(plan, [long, short], truncate=False) == {"short": 100}


def test_a_chunked_prefill_under_way_is_charged_before_any_candidate() -> None:
    controller = echo()
    plan = controller.begin(view([online_with_slack(0.004)]))
    short = OfflineCandidate("short", extend=100, prefix=0, max_new_tokens=8)
    assert controller.choose_offline(plan, [short], continuing=(250, 500, 8), truncate=False) == {}
    # the real budget is not charged by the selection: the engine charges it as it admits
    assert plan.budget.offline_prefill_tokens == 0


def test_ties_go_to_the_candidate_whose_resident_prefix_more_requests_reuse() -> None:
    controller = echo()
    plan = controller.begin(view([online_with_slack(0.5)]))
    lonely = OfflineCandidate("lonely", extend=50, prefix=300, max_new_tokens=8, reusers=0)
    popular = OfflineCandidate("popular", extend=50, prefix=300, max_new_tokens=8, reusers=5)
    assert list(controller.choose_offline(plan, [lonely, popular], truncate=False)) == ["popular", "lonely"]


def test_only_the_candidate_window_is_weighed() -> None:
    controller = echo()
    plan = controller.begin(view([online_with_slack(0.5)], chunk_tokens=None))
    pool = [OfflineCandidate(f"r{i}", extend=10, prefix=0, max_new_tokens=1) for i in range(CANDIDATE_WINDOW + 5)]
    admit = controller.choose_offline(plan, pool, truncate=False)
    assert list(admit) == [f"r{i}" for i in range(CANDIDATE_WINDOW)]
    assert plan.echo.candidates == CANDIDATE_WINDOW


@pytest.mark.parametrize("seed", range(40))
def test_the_selection_never_breaks_the_deadline_nor_the_offline_memory(seed: int) -> None:
    rng = random.Random(seed)
    controller = echo()
    slack = rng.uniform(0.0015, 0.02)
    running = [online_with_slack(slack, rng.randint(10, 500))]
    online_only = BatchShape().with_decode(running[0].context)
    running += [offline(f"d{i}", rng.randint(10, 3000), reserved=rng.randint(0, 300)) for i in range(rng.randint(0, 6))]
    capacity = rng.randint(3000, 20_000)
    plan = controller.begin(view(running, kv_capacity=capacity, chunk_tokens=rng.choice([None, 512, 2048])))
    memory = plan.budget.offline_memory
    candidates = [OfflineCandidate(f"c{i}", rng.randint(1, 1500), rng.choice([0, rng.randint(1, 800)]),
                                   rng.randint(1, 400), fresh=rng.random() < 0.7, reusers=rng.randint(0, 3))
                  for i in range(rng.randint(0, 20))]
    by_rid = {candidate.rid: candidate for candidate in candidates}
    admit = controller.choose_offline(plan, candidates, truncate=rng.random() < 0.5)
    # Replay the selection on the real budget the way the engine admits.
    budget = plan.budget
    for rid, chunk in admit.items():
        candidate = by_rid[rid]
        assert 0 < chunk <= candidate.extend
        budget.commit_offline_prefill(chunk, candidate.prefix, chunk == candidate.extend, candidate.max_new_tokens)
    assert budget.predicted_s() <= max(slack, plan.budget.latency_s) + 1e-12
    assert plan.budget.latency_s <= max(slack, MODEL.predict(online_only) * (1 + NEAR_ZERO_FRACTION)) + 1e-12
    assert budget.offline_memory >= 0 or not admit
    assert sum(chunk + by_rid[rid].max_new_tokens for rid, chunk in admit.items()) <= max(memory, 0)
    assert sum(1 for rid, chunk in admit.items() if chunk < by_rid[rid].extend) <= 1


def test_online_work_past_the_deadline_leaves_offline_work_only_what_costs_next_to_nothing() -> None:
    """The online part (1 ms + 0.1 ms decode + a 400-token prompt, 4 ms) is past the 1 ms slack:
    the budget is the online part plus 1%, 51 µs. A one-token prefill (10 µs) still goes; the
    offline decode (0.1 ms) and a 100-token prefill (1 ms) do not."""
    controller = echo()
    plan = controller.begin(view([online_with_slack(0.001), offline("a", 100)],
                                 [WaitingOnline("new", 400, 16, 9.9)]))
    assert plan.park == ["a"]
    assert plan.budget.latency_s == pytest.approx(0.0051 * (1 + NEAR_ZERO_FRACTION))
    candidates = [OfflineCandidate("big", 100, 0, 1), OfflineCandidate("c", 1, 0, 1)]
    assert controller.choose_offline(plan, candidates, truncate=False) == {"c": 1}


def test_echo_caps_an_iteration_at_the_tbt_target_and_takes_the_idle_cap_without_online_requests() -> None:
    """A deadline 500 ms away still leaves an online decode waiting one iteration per token: the
    iteration is capped at the TBT target (50 ms); a nearer deadline (3 ms) binds instead; with no
    online request present the idle cap (7 ms) does."""
    controller = echo(idle_budget_s=0.007)
    assert controller.begin(view([online_with_slack(0.5), offline("a", 100)])).budget.latency_s == pytest.approx(TPOT_S)
    assert controller.begin(view([online_with_slack(0.003)])).budget.latency_s == pytest.approx(0.003)
    assert controller.begin(view([offline("a", 100)])).budget.latency_s == pytest.approx(0.007)


def test_the_summary_reports_the_decisions_and_their_rate() -> None:
    controller = echo()
    plan: IterationPlan = controller.begin(view([online_with_slack(0.5), offline("a", 1000)]))
    controller.choose_offline(plan, [OfflineCandidate("c", 100, 200, 8)], truncate=False)
    summary = plan.summary()["echo"]
    assert summary["adjustments"] == {KEEP_DECODE: 1, ADD_PREFILL: 1}
    assert summary["benefit"] == 1 + 300 and summary["punishment"] == 0
    # 1 ms + 0.1 ms online + 1 ms offline decode + 1 ms prefill
    assert summary["predicted_s"] == pytest.approx(0.0031)
    assert summary["benefit_per_s"] == pytest.approx(301 / 0.0031, rel=1e-3)


def test_hygen_mode_makes_no_echo_decisions() -> None:
    hygen = ColocationController(ColocationConfig(mode="hygen", latency_model=MODEL.to_dict(), latency_budget_s=0.01))
    plan = hygen.begin(view([offline("a", 100)]))
    assert plan.echo is None and "echo" not in plan.summary()


def test_a_request_the_plan_just_took_out_does_not_come_back_in_the_same_iteration() -> None:
    """"a" is preempted for the online request's memory and "b" parked for the deadline; both wait
    again as one-token prefills on resident KV, which would fit, but not in this iteration."""
    controller = echo()
    running = [online_with_slack(0.0035), offline("a", 600, reserved=100), offline("b", 2000, reserved=10)]
    plan = controller.begin(view(running, [WaitingOnline("new", 100, 300, 9.9)], kv_capacity=3200))
    assert plan.preempt == ["a"] and plan.park == ["b"]
    back = [OfflineCandidate(rid, 1, context, reserved, fresh=False) for rid, context, reserved in
            (("a", 600, 100), ("b", 2000, 10))]
    fresh = OfflineCandidate("c", 10, 0, 4)
    assert controller.choose_offline(plan, [*back, fresh], truncate=False) == {"c": 10}
