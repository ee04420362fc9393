"""Alg. 1 on hand-built queues: a linear cost model whose numbers are easy to follow.

Each decode costs 10 ms plus 1 ms per request, each prefill 1 ms plus 0.1 ms per token, so the
batches' predicted times are exact and every edge case is built from them.
"""

from __future__ import annotations

import math

import pytest

from sgl_blend.core.bros.batch_size import AdaptiveBatchSize, Pressure
from sgl_blend.core.bros.cost import IterationCost, PeriodTail, SwapModel
from sgl_blend.core.host_gap import HostTime
from sgl_blend.core.bros.packing import BrosScheduler, MemoryState
from sgl_blend.core.bros.requests import SLO, BrosRequest
from sgl_blend.core.latency_model import BatchShape, LinearLatencyModel

COEFFICIENTS = (0.001, 0.0001, 0.0, 0.010, 0.001, 0.0)
PLENTY = MemoryState(free_slots=1_000_000)


def scheduler(cap: int = 1024, base: int = 128) -> BrosScheduler:
    cost = IterationCost(LinearLatencyModel("bros", COEFFICIENTS))
    return BrosScheduler(cost, SLO(ttft_s=0.4, tpot_s=0.2), AdaptiveBatchSize(cap, base))


def decoding(rid: str, realtime: bool, last_token_at: float, prompt: int = 100) -> BrosRequest:
    return BrosRequest(rid, realtime, arrival=0.0, prompt_len=prompt, generated=1, last_token_at=last_token_at)


def test_cost_is_exec_or_swap_whichever_is_longer() -> None:
    swap = SwapModel(bytes_per_token=1000.0, bytes_per_s=1e6)
    cost = IterationCost(LinearLatencyModel("bros", COEFFICIENTS), swap)
    shape = BatchShape().with_decode(50)
    assert cost.predict(shape) == pytest.approx(0.011)
    assert cost.predict(shape, swap_tokens=5) == pytest.approx(0.011)
    assert cost.predict(shape, swap_tokens=50) == pytest.approx(0.05)


def test_swap_model_fit_recovers_bandwidth_and_setup() -> None:
    samples = [(size, 1e-5 + size / 5e10) for size in (2**20, 2**24, 2**26, 2**28)]
    model = SwapModel.fit(samples, bytes_per_token=4096)
    assert model.bytes_per_s == pytest.approx(5e10, rel=1e-6)
    assert model.setup_s == pytest.approx(1e-5, rel=1e-3)
    with pytest.raises(ValueError, match="two timed copies"):
        SwapModel.fit(samples[:1], 4096)


def test_host_time_learns_intercept_and_per_request_gap_and_forgets_an_old_host() -> None:
    host = HostTime(window=50)
    assert host.seconds(100) == 0.0  # nothing measured: a host that keeps up
    for requests in (10, 200) * 100:
        host.observe(requests, 0.006 + 0.00012 * requests)
    assert host.intercept_s == pytest.approx(0.006) and host.per_request_s == pytest.approx(0.00012)
    for requests in (10, 200) * 300:  # the host got faster: the fit follows within its window
        host.observe(requests, 0.001)
    assert host.seconds(200) == pytest.approx(0.001, rel=1e-3)


def test_host_time_with_one_batch_size_is_its_mean_gap_and_never_negative() -> None:
    host = HostTime()
    for gap in (0.004, 0.006):
        host.observe(32, gap)
    assert host.per_request_s == 0.0 and host.intercept_s == 0.0  # one size: no line through it yet
    host.observe(64, 0.001)  # falling with size: no negative per-request time
    assert host.per_request_s == 0.0 and host.intercept_s == pytest.approx(0.011 / 3, rel=0.01)


def test_host_time_bounds_the_batch_the_forward_alone_would_let_grow() -> None:
    """An RT decode due in 50.1 ms, a device that runs any batch in 1 ms and a host that takes
    0.2 ms a request: without the host BROS packs every BE request; with it, only as many as the
    residual pays for. (Iterations have averaged 50 ms, so no BE request may replace the RT one.)"""
    cheap = LinearLatencyModel("bros", (0.0, 0.0, 0.0, 0.001, 0.0, 0.0))
    host = HostTime()
    for requests in (1, 400):
        host.observe(requests, 0.0002 * requests)
    plans = []
    for cost in (IterationCost(cheap), IterationCost(cheap, host=host)):
        bros = BrosScheduler(cost, SLO(ttft_s=0.4, tpot_s=0.2), AdaptiveBatchSize(1024, 1024))
        bros.average_iteration_s = 0.05
        bros.submit(decoding("rt", True, last_token_at=-0.1499))  # due at 0.0501
        for i in range(300):
            bros.submit(decoding(f"be{i}", False, last_token_at=0.0))
        plans.append(bros.plan(0.0, PLENTY))
    alone, with_host = plans
    assert len(alone.realtime) == 1 and len(alone.best_effort) == 300
    # 1 ms + 0.2 ms per request <= 50.1 ms: 245 requests, the RT one and 244 BE
    assert len(with_host.realtime) == 1 and len(with_host.best_effort) == 244


def test_period_tail_is_the_quantile_of_overruns_in_its_window_and_never_negative() -> None:
    tail = PeriodTail(quantile=0.9, window=10)
    assert tail.seconds() == 0.0  # nothing measured: the plan is the mean model's
    for overrun_ms in range(1, 11):  # periods 1..10 ms past a 50 ms prediction
        tail.observe(0.05, 0.05 + overrun_ms / 1000)
    assert tail.seconds() == pytest.approx(0.010)  # the 90% quantile of ten: the tenth
    for _ in range(10):  # the window moves on: periods now 20 ms shorter than predicted
        tail.observe(0.05, 0.03)
    assert tail.seconds() == 0.0  # over-prediction leaves its slack, it is not spent
    with pytest.raises(ValueError, match="quantile"):
        PeriodTail(quantile=1.0)


def test_the_plan_keeps_the_tail_margin_below_its_deadline_and_learns_it_from_finished_iterations() -> None:
    """The same RT decode due in 50.1 ms and a 1 ms device with a host of 0.2 ms a request: once
    iterations have run 10 ms past their predictions, the plan leaves 10 ms of the residual free,
    50 fewer requests; the summary shows the margin inside its prediction."""
    cheap = LinearLatencyModel("bros", (0.0, 0.0, 0.0, 0.001, 0.0, 0.0))
    host = HostTime()
    for requests in (1, 400):
        host.observe(requests, 0.0002 * requests)
    bros = BrosScheduler(IterationCost(cheap, host=host, tail=PeriodTail(0.99)), SLO(0.4, 0.2), AdaptiveBatchSize(1024, 1024))
    bros.average_iteration_s = 0.05
    warm = bros.plan(0.0, PLENTY)  # nothing queued: an empty plan, predicted at its mean
    for _ in range(5):
        bros.finish(warm, 0.0, measured_s=warm.predicted_s + 0.010)
    bros.submit(decoding("rt", True, last_token_at=-0.1499))
    for i in range(300):
        bros.submit(decoding(f"be{i}", False, last_token_at=0.0))
    plan = bros.plan(0.0, PLENTY)
    # 1 ms + 0.2 ms per request + 10 ms <= 50.1 ms: 195 requests, the RT one and 194 BE
    assert len(plan.realtime) == 1 and len(plan.best_effort) == 194
    assert plan.summary()["margin_s"] == pytest.approx(0.010)
    assert plan.predicted_s == pytest.approx(0.001 + 0.0002 * 195 + 0.010)


def test_without_realtime_requests_best_effort_fills_the_batch_and_it_doubles() -> None:
    bros = scheduler(cap=300, base=4)
    for i in range(10):
        bros.submit(BrosRequest(f"be{i}", False, arrival=0.0, prompt_len=8))
    plan = bros.plan(0.0, PLENTY)
    assert plan.realtime == [] and [r.rid for r in plan.best_effort] == ["be0", "be1", "be2", "be3"]
    assert math.isinf(plan.budget_s) and plan.pressure is Pressure.NONE
    assert bros.batch_size.current == 8
    bros.finish(plan, 0.05)
    assert len(bros.plan(0.05, PLENTY).best_effort) == 8


def test_without_realtime_requests_the_idle_cap_bounds_the_batch_but_never_empties_it() -> None:
    cost = IterationCost(LinearLatencyModel("bros", COEFFICIENTS))
    bros = BrosScheduler(cost, SLO(ttft_s=0.4, tpot_s=0.2, idle_s=0.003), AdaptiveBatchSize(64, 64))
    for i in range(4):
        bros.submit(BrosRequest(f"be{i}", False, arrival=0.0, prompt_len=8))  # 1 ms + 0.8 ms per prompt
    plan = bros.plan(0.0, PLENTY)
    assert [r.rid for r in plan.best_effort] == ["be0", "be1"] and plan.budget_s == 0.003
    long_prompt = BrosScheduler(cost, SLO(idle_s=0.003), AdaptiveBatchSize(64, 64))
    long_prompt.submit(BrosRequest("long", False, arrival=0.0, prompt_len=500))  # 51 ms alone
    assert [r.rid for r in long_prompt.plan(0.0, PLENTY).best_effort] == ["long"]


def test_realtime_requests_run_most_urgent_first_within_the_budget() -> None:
    bros = scheduler()
    # Pending decodes due at 0.2 + last token; the waiting prefill is due at 0.4.
    for rid, last in (("late-ish", 0.0), ("later", 0.15), ("soon", 0.01)):
        bros.submit(BrosRequest(rid, True, arrival=0.0, prompt_len=10))
        request = next(r for r in bros.realtime.waiting if r.rid == rid)
        bros.realtime.remove(request)
        request.generated, request.last_token_at = 1, last
        bros.realtime.requeue(request)
    bros.submit(BrosRequest("new", True, arrival=0.1, prompt_len=10))
    order = [r.rid for r in bros.realtime.in_order()]
    assert order == ["late-ish", "soon", "later", "new"]
    plan = bros.plan(0.16, PLENTY)
    assert plan.budget_s == pytest.approx(0.04)
    assert [r.rid for r in plan.realtime] == order
    assert plan.predicted_s == pytest.approx(0.010 + 0.003 + 0.001 + 0.001)


def test_budget_stops_realtime_admission_and_resets_the_batch_size() -> None:
    bros = scheduler(base=2)
    bros.batch_size.current = 64
    bros.submit(decoding("decode", True, last_token_at=0.0))  # 11 ms
    bros.submit(BrosRequest("prompt", True, arrival=0.0, prompt_len=300))  # 31 ms
    plan = bros.plan(0.17, PLENTY)  # the decode has 30 ms left; both would take 42 ms
    assert plan.late == 0 and plan.budget_s == pytest.approx(0.03)
    assert [r.rid for r in plan.realtime] == ["decode"]
    assert plan.pressure is Pressure.VIOLATION and bros.batch_size.current == 2


def test_a_batch_the_size_fills_grows_while_real_time_requests_wait() -> None:
    """More RT requests than the batch size, all within budget: the size doubles (only the time
    budget holds it back), so the RT queue is served within a few iterations, not held at the base."""
    bros = scheduler(cap=64, base=2)
    for i in range(6):
        bros.submit(decoding(f"rt{i}", True, last_token_at=0.0))
    sizes = []
    for step in range(3):
        plan = bros.plan(0.01 * step, PLENTY)
        sizes.append(len(plan.realtime))
        bros.finish(plan, 0.01 * step)
    assert plan.pressure is Pressure.NONE
    assert sizes == [2, 4, 6] and bros.batch_size.current == 16


def test_infeasible_head_runs_alone_and_does_not_set_the_budget() -> None:
    bros = scheduler()
    bros.submit(BrosRequest("doomed", True, arrival=0.0, prompt_len=3000))  # 301 ms prefill
    bros.submit(BrosRequest("fine", True, arrival=0.35, prompt_len=10))  # due 0.75
    plan = bros.plan(0.2, PLENTY)
    # "doomed" (200 ms left, 301 ms alone) cannot make it; the budget is "fine"'s 550 ms.
    assert plan.late == 1 and plan.budget_s == pytest.approx(0.55)
    assert [r.rid for r in plan.realtime] == ["doomed", "fine"]
    tight = scheduler()
    tight.submit(BrosRequest("big", True, arrival=0.0, prompt_len=3000))
    tight.submit(BrosRequest("tight", True, arrival=0.0, prompt_len=10))
    plan = tight.plan(0.39, PLENTY)  # "tight" has 10 ms, "big" would blow it: "big" runs alone
    assert [r.rid for r in plan.realtime] == ["big"]
    assert plan.pressure is Pressure.VIOLATION


def test_best_effort_replaces_the_least_urgent_realtime_request_when_the_batch_is_full() -> None:
    bros = scheduler(cap=2, base=2)
    bros.submit(decoding("urgent", True, last_token_at=0.0))
    bros.submit(BrosRequest("relaxed", True, arrival=0.1, prompt_len=10))
    bros.submit(decoding("be", False, last_token_at=0.0))
    plan = bros.plan(0.01, PLENTY)
    assert [r.rid for r in plan.realtime] == ["urgent"] and [r.rid for r in plan.best_effort] == ["be"]
    assert plan.replaced == 1
    # The displaced request went back to the head of its queue.
    assert [r.rid for r in bros.realtime.in_order()] == ["relaxed"]


def test_replacement_never_makes_the_displaced_request_miss_its_deadline() -> None:
    bros = scheduler(cap=2, base=2)
    bros.average_iteration_s = 0.05
    bros.submit(decoding("urgent", True, last_token_at=0.0))
    bros.submit(decoding("close", True, last_token_at=0.0))
    bros.submit(decoding("be", False, last_token_at=0.0))
    plan = bros.plan(0.15, PLENTY)  # "close" has 50 ms; this batch + the average is 62 ms
    assert [r.rid for r in plan.realtime] == ["urgent", "close"] and plan.best_effort == []


def test_best_effort_packs_by_swap_cost_and_only_into_free_slots() -> None:
    bros = scheduler()
    heavy = decoding("heavy", False, last_token_at=0.0)
    heavy.host_tokens = 40
    bros.submit(heavy)
    bros.submit(decoding("light", False, last_token_at=0.0))
    plan = bros.plan(0.0, MemoryState(free_slots=10))
    assert [r.rid for r in plan.best_effort] == ["light"]  # heavy needs 41 slots, 10 are free
    plan_all = scheduler()
    for request in (heavy, decoding("light", False, 0.0)):
        plan_all.submit(request)
    assert [r.rid for r in plan_all.plan(0.0, PLENTY).best_effort] == ["light", "heavy"]


def test_realtime_may_claim_best_effort_slots_but_best_effort_may_not() -> None:
    roomy = scheduler()
    roomy.submit(BrosRequest("rt", True, arrival=0.0, prompt_len=30))
    roomy.submit(BrosRequest("be-new", False, arrival=0.0, prompt_len=5))
    plan = roomy.plan(0.0, MemoryState(free_slots=10, best_effort_resident={"parked-be": 50}))
    # be-new gets 5 free slots; rt the other 5 and 25 of parked-be's.
    assert [r.rid for r in plan.best_effort] == ["be-new"]
    bros = scheduler()
    bros.submit(BrosRequest("rt", True, arrival=0.0, prompt_len=30))
    bros.submit(BrosRequest("be-new", False, arrival=0.0, prompt_len=5))
    memory = MemoryState(free_slots=10, best_effort_resident={"parked-be": 20})
    plan = bros.plan(0.0, memory)
    # rt needs all 10 free slots and all 20 of parked-be's; nothing is left for be-new.
    assert [r.rid for r in plan.realtime] == ["rt"] and plan.best_effort == []


def test_finish_requeues_realtime_at_the_new_deadline_and_retires_the_finished() -> None:
    bros = scheduler()
    bros.submit(BrosRequest("a", True, arrival=0.0, prompt_len=10))
    bros.submit(BrosRequest("b", True, arrival=0.0, prompt_len=10))
    bros.submit(BrosRequest("c", False, arrival=0.0, prompt_len=10))
    plan = bros.plan(0.0, PLENTY)
    assert len(bros.realtime) == 0
    bros.finish(plan, 0.03, finished=["b", "c"], measured_s=0.03)
    assert [(r.rid, r.generated, r.last_token_at) for r in bros.realtime.in_order()] == [("a", 1, 0.03)]
    assert bros.best_effort == {}
    assert bros.average_iteration_s == pytest.approx(0.006)


def test_requests_left_out_keep_their_place_and_a_request_not_run_keeps_its_deadline() -> None:
    bros = scheduler(cap=1, base=1)
    bros.submit(BrosRequest("first", True, arrival=0.0, prompt_len=10))
    bros.submit(BrosRequest("second", True, arrival=0.01, prompt_len=10))
    plan = bros.plan(0.02, PLENTY)
    assert [r.rid for r in plan.realtime] == ["first"]
    bros.finish(plan, 0.03, not_run=["first"])
    assert [(r.rid, r.generated) for r in bros.realtime.in_order()] == [("first", 0), ("second", 0)]


def test_bad_requests_are_refused() -> None:
    bros = scheduler()
    with pytest.raises(ValueError, match="empty prompt"):
        BrosRequest("x", True, arrival=0.0, prompt_len=0)
    bros.submit(BrosRequest("late", True, arrival=1.0, prompt_len=3))
    with pytest.raises(ValueError, match="arrived before"):
        bros.submit(BrosRequest("early", True, arrival=0.5, prompt_len=3))
    bros.submit(BrosRequest("be", False, arrival=0.0, prompt_len=3))
    with pytest.raises(ValueError, match="already queued"):
        bros.submit(BrosRequest("be", False, arrival=0.0, prompt_len=3))
    with pytest.raises(ValueError, match="positive"):
        AdaptiveBatchSize(0)


def test_metrics_count_deadlines_per_token_and_per_request() -> None:
    from sgl_blend.core.bros.metrics import ServiceMetrics

    metrics = ServiceMetrics(SLO(ttft_s=0.4, tpot_s=0.2))
    metrics.arrived("fast", True, 0.0)
    for t in (0.1, 0.2, 0.3):
        metrics.token("fast", t)
    metrics.finished("fast", 0.3)
    metrics.arrived("slow", True, 0.0)
    metrics.token("slow", 0.5)          # TTFT missed
    metrics.token("slow", 0.6)          # gap met
    metrics.token("slow", 1.6, count=2)  # two gaps of 0.5: missed
    metrics.finished("slow", 1.6)
    metrics.arrived("be", False, 0.0)
    metrics.token("be", 1.0, count=5)
    metrics.finished("be", 2.0)
    summary = metrics.summary()
    assert summary["ttft_attainment"] == 0.5
    assert summary["tpot_attainment_per_token"] == pytest.approx(3 / 5)
    assert summary["tpot_attainment_per_request"] == 0.5  # slow's mean gap is 1.1 / 3
    assert summary["token_attainment"] == pytest.approx(4 / 7)
    assert summary["normalized_latency_s"] == pytest.approx((0.3 / 3 + 1.6 / 4) / 2)
    assert summary["be_requests_per_s"] == pytest.approx(0.5)
    metrics.arrived("starved", True, 1.0)
    assert metrics.summary(now=1.3)["ttft_attainment"] == 0.5
    assert metrics.summary(now=1.5)["ttft_attainment"] == pytest.approx(1 / 3)


def test_merged_heads_give_the_order_a_full_sort_would_and_unpop_restores_it() -> None:
    import random

    from sgl_blend.core.bros.urgency import RealtimeQueues

    slo = SLO(ttft_s=0.4, tpot_s=0.2)
    queues = RealtimeQueues(slo)
    rng = random.Random(7)
    requests = []
    for index in range(60):
        request = BrosRequest(f"r{index}", True, arrival=index * 0.01, prompt_len=5)
        if rng.random() < 0.5:
            request.generated, request.last_token_at = 1, rng.uniform(0.0, 0.6)
        requests.append(request)
        queues.arrive(request)
    expected = sorted(requests, key=lambda r: r.deadline(slo))
    assert [r.rid for r in queues.in_order()] == [r.rid for r in expected]
    cursor = queues.cursor()
    popped = [cursor.pop() for _ in range(10)]
    cursor.unpop()
    cursor.unpop()
    assert cursor.peek() is popped[8]
    assert [r.rid for r in queues.take(cursor)] == [r.rid for r in expected[:8]]
    assert [r.rid for r in queues.in_order()] == [r.rid for r in expected[8:]]


def test_a_long_best_effort_prompt_is_chunked_to_the_residual_budget_and_yields_no_token_until_its_end() -> None:
    """An RT decode due in 29.95 ms costs 11 ms; a 2000-token BE prompt (201 ms whole) gets the chunk
    that fills the rest: 1 ms + 0.1 ms per token more, so 179 tokens (29.9 ms in all)."""
    bros = scheduler()
    bros.submit(decoding("rt", True, last_token_at=-0.17005))
    long = BrosRequest("be", False, arrival=0.0, prompt_len=2000)
    bros.submit(long)
    plan = bros.plan(0.0, PLENTY)
    assert [r.rid for r in plan.best_effort] == ["be"] and long.chunk == 179
    assert plan.predicted_s == pytest.approx(0.0299) and plan.predicted_s <= plan.budget_s
    assert not long.yields_token() and long.add_to(BatchShape()).prefill_tokens == 179
    bros.finish(plan, 0.0299)
    assert (long.generated, long.prompt_done, long.chunk) == (0, 179, None)
    # Its next chunk attends to the 179 tokens computed; the step that ends the prompt yields a token.
    long.chunk = 1821
    assert long.add_to(BatchShape()).prefill_attention == 1821 * 2000 and long.yields_token()
    # Had its KV been dropped, the whole prompt would be computed again, on no prefix.
    long.chunk, long.dropped = None, True
    assert (long.prompt_left(), long.add_to(BatchShape()).prefill_attention) == (2000, 2000 * 2000)


def test_an_empty_batch_runs_a_best_effort_chunk_sized_to_the_idle_cap() -> None:
    """No RT request: the idle cap (11 ms) bounds the first BE prompt to 100 tokens, not its 5000."""
    cost = IterationCost(LinearLatencyModel("bros", COEFFICIENTS))
    bros = BrosScheduler(cost, SLO(ttft_s=0.4, tpot_s=0.2, idle_s=0.011), AdaptiveBatchSize(64, 8))
    bros.submit(BrosRequest("be", False, arrival=0.0, prompt_len=5000))
    plan = bros.plan(0.0, PLENTY)
    assert [(r.rid, r.chunk) for r in plan.best_effort] == [("be", 100)]
    assert plan.predicted_s == pytest.approx(0.011)
