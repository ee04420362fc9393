"""Simulator co-location: online arrivals and an offline pool planned by the core controller.

Small synthetic workloads (no tokenizer) on Llama-3.1-8B / H100 iteration times; every figure
compared is simulated time, deterministic for a seed.
"""

from __future__ import annotations

import random

import pytest

from sgl_blend.workloads.arrivals import BURST_HIGH, BURST_LOW, arrival_times
from sgl_blend.core.colocation import ColocationConfig, ColocationController, IterationView
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.measure.online_replay import summarize
from sgl_blend.sim.colocation import ColocatedConfig, ColocatedEngine, ColocatedResult, OnlineArrival
from sgl_blend.forward_time.overlap import overlap_function
from sgl_blend.server.window import QUEUE_FLOOR
from sgl_blend.forward_time.step_time import NoisyClock, StepTime, fit_latency
from sgl_blend.sim.workload import SimRequest, chain_hash

MODEL = model_spec("llama-3.1-8b")
HARDWARE = HardwareSpec.resolve("h100-sxm")
COST = CostModel(MODEL, HARDWARE)
STEP = StepTime.of(COST, overlap_function("sum"))
HORIZON_S = 4.0


@pytest.fixture(scope="module")
def latency_model() -> dict:
    fit = fit_latency(NoisyClock(STEP, jitter=0.0), count=200)
    return fit.models["hygen"].to_dict()


def online_load(rate: float = 6.0, seed: int = 0) -> list[OnlineArrival]:
    rng = random.Random(seed)
    return [OnlineArrival(at, SimRequest(f"on-{i}", "online", (), rng.randint(50, 900), rng.randint(20, 200),
                                         4096, False))
            for i, at in enumerate(arrival_times("poisson", rate, HORIZON_S, HORIZON_S, seed))]


def offline_pool(n: int = 600, seed: int = 0) -> list[SimRequest]:
    """Requests under a few shared system prompts, mixed output lengths."""
    rng = random.Random(seed)
    systems = [(chain_hash("", f"system-{k}"), 200) for k in range(4)]
    return [SimRequest(f"off-{i}", "offline", (systems[i % 4],), rng.randint(20, 600), rng.randint(1, 300), 512,
                       False) for i in range(n)]


class CountingController(ColocationController):
    """The real controller; counts its plans and keeps every view it was shown."""

    def __init__(self, config: ColocationConfig) -> None:
        super().__init__(config)
        self.views: list[IterationView] = []

    def begin(self, view: IterationView):
        self.views.append(view)
        return super().begin(view)


def run(latency_model: dict, *, budget_s: float | None = None, offline: list[SimRequest] | None = None,
        kv_capacity: int | None = None, offline_rate: float | None = None, mixed: bool = True,
        policy: str = "psm") -> tuple[ColocatedResult, CountingController]:
    controller = CountingController(ColocationConfig(mode="hygen", latency_budget_s=budget_s,
                                                     latency_model=latency_model))
    offline = offline_pool() if offline is None else offline
    engine = ColocatedEngine(NoisyClock(STEP, jitter=0.0), controller,
                             make_offline_policy(policy, MODEL, HARDWARE) if offline else None,
                             ColocatedConfig(kv_capacity or COST.kv_capacity_tokens(), offline_rate=offline_rate,
                                             mixed=mixed))
    return engine.run(online_load(), offline, HORIZON_S), controller


def test_every_online_request_completes_with_its_full_output(latency_model: dict) -> None:
    arrivals = online_load()
    result, controller = run(latency_model, budget_s=0.006)
    assert [timing.tokens for timing in result.online] == [a.request.output_len for a in arrivals]
    assert all(timing.ttft is not None and timing.ttft >= 0 for timing in result.online)
    # Taken in at the loop's next iteration: some wait for the one under way, none past their token.
    assert all(0 <= timing.received < timing.ttft for timing in result.online)
    assert any(timing.received > 0 for timing in result.online)
    assert len(controller.views) == result.iterations
    assert result.offline_tokens_per_s() > 0


def test_online_only_serving_runs_no_offline_work(latency_model: dict) -> None:
    result, _ = run(latency_model, offline=[])
    assert result.offline_events == []
    assert result.offline_tokens_per_s() == 0


def test_offline_output_tokens_are_counted_apart_from_prompts(latency_model: dict) -> None:
    """The emulated judge counts a batch's output tokens; the simulator's output figure must not
    carry prompts. One-token replies of 100-token prompts: a finished request adds 101 tokens to
    the offline events and 1 to the output events."""
    offline = [SimRequest(f"off-{i}", "offline", (), 100, 1, 1, True) for i in range(300)]
    result, _ = run(latency_model, budget_s=0.02, offline=offline)
    outputs = sum(count for _at, count in result.offline_output_events)
    assert outputs == result.counts["offline_finished"] > 0
    assert sum(count for _at, count in result.offline_events) == 101 * outputs
    assert result.offline_output_tokens_per_s() * 101 == pytest.approx(result.offline_tokens_per_s())
    # An online trace that began after the batch did is judged on its own window.
    times = sorted(at for at, _count in result.offline_output_events)
    since = times[len(times) // 2]
    later = sum(count for at, count in result.offline_output_events if since < at <= result.horizon_s)
    assert 0 < later < outputs
    assert result.offline_output_tokens_per_s(since) == pytest.approx(later / (result.horizon_s - since))


def released_through_the_batch_window(latency_model: dict, budget_s: float | None) -> int:
    """Offline requests that reached the policy when fed as the Batch API feeds a co-locating engine."""
    policy = make_offline_policy("psm", MODEL, HARDWARE)
    submitted: list = []
    submit = policy.submit

    def counted(requests):
        batch = list(requests)
        submitted.extend(batch)
        return submit(batch)

    policy.submit = counted
    controller = ColocationController(ColocationConfig(mode="hygen", latency_budget_s=budget_s,
                                                       latency_model=latency_model))
    engine = ColocatedEngine(NoisyClock(STEP, jitter=0.0), controller, policy,
                             ColocatedConfig(COST.kv_capacity_tokens(), batch_window=True))
    engine.run(online_load(), offline_pool(), HORIZON_S)
    return len(submitted)


def test_the_batch_window_feeds_what_runs_and_as_many_again(latency_model: dict) -> None:
    """A budget below any iteration leaves offline work one unit in each iteration with nothing
    online in it: the window releases its floor and barely more. Without a budget offline work
    runs, and the window grows with it."""
    starved = released_through_the_batch_window(latency_model, 1e-6)
    assert QUEUE_FLOOR <= starved < 2 * QUEUE_FLOOR < released_through_the_batch_window(latency_model, None)


def test_a_latency_budget_trades_offline_throughput_for_online_latency(latency_model: dict) -> None:
    online_only, _ = run(latency_model, offline=[])
    tight, _ = run(latency_model, budget_s=0.0055)
    loose, _ = run(latency_model, budget_s=0.008)
    unbounded, _ = run(latency_model)
    tbt = [summarize(r.online)["tbt_p99"] for r in (online_only, tight, unbounded)]
    offline = [r.offline_tokens_per_s() for r in (tight, loose, unbounded)]
    # Two budgets a few µs apart in P99 TBT need not order: the tight budget is held against both ends.
    assert tbt == sorted(tbt) and tbt[0] < tbt[-1]
    assert offline == sorted(offline) and 0 < offline[0] < offline[-1]


def test_the_planner_parks_offline_decodes_the_budget_cannot_carry(latency_model: dict) -> None:
    result, controller = run(latency_model, budget_s=0.0055)
    assert result.counts["parked"] > 0
    unbounded, _ = run(latency_model)
    assert unbounded.counts["parked"] == 0


def test_online_arrivals_take_kv_back_from_offline_work(latency_model: dict) -> None:
    arrivals = online_load()
    result, _ = run(latency_model, kv_capacity=6000)
    assert result.counts["retracted"] > 0
    assert [timing.tokens for timing in result.online] == [a.request.output_len for a in arrivals]
    assert result.peak_kv <= 6000


def test_a_fixed_offline_rate_releases_no_more_than_the_rate_allows(latency_model: dict) -> None:
    result, _ = run(latency_model, offline_rate=2.0)
    # Requests released by the horizon: one at time 0, then two a second.
    assert 0 < result.counts["offline_finished"] <= 1 + int(2.0 * result.seconds)


def test_without_mixed_batches_a_prefill_iteration_stalls_every_decode(latency_model: dict) -> None:
    mixed, _ = run(latency_model, policy="fcfs")
    unmixed, _ = run(latency_model, policy="fcfs", mixed=False)
    assert summarize(unmixed.online)["tbt_p99"] > summarize(mixed.online)["tbt_p99"]


class RecordingClock(NoisyClock):
    """The noiseless clock; keeps every batch shape it priced."""

    def __init__(self) -> None:
        super().__init__(STEP, jitter=0.0)
        self.shapes: list = []

    def measure(self, shape):
        self.shapes.append(shape)
        return super().measure(shape)


def test_a_prompt_completing_its_chunk_leaves_room_for_a_new_prompt_cut(latency_model: dict) -> None:
    """SGLang holds one chunked request at a time: once the one under way completes, the next
    prompt may be cut into the room left, as the plugin's adder does. 800-token prompts on a
    512-token chunk fill every iteration but the last; forbidding the cut left 288-token ones."""
    offline = [SimRequest(f"off-{i}", "offline", (), 800, 1, 1, True) for i in range(20)]
    clock = RecordingClock()
    controller = ColocationController(ColocationConfig(mode="hygen", latency_model=latency_model))
    engine = ColocatedEngine(clock, controller, make_offline_policy("fcfs", MODEL, HARDWARE),
                             ColocatedConfig(COST.kv_capacity_tokens(), chunk_tokens=512))
    result = engine.run([], offline, 1.0)
    assert result.counts["offline_finished"] == 20
    prefills = [shape.prefill_tokens for shape in clock.shapes]
    assert sum(prefills) == 20 * 800
    assert prefills[:-1] == [512] * (len(prefills) - 1)
    # Beside a prompt that stays chunked nothing is admitted: never more than two prompts a batch.
    assert max(shape.prefill_reqs for shape in clock.shapes) == 2


def test_the_latency_fit_on_simulated_batches_is_tight_without_noise() -> None:
    # A GEMM costs max(FLOP time, weight-read time) (`IterationCost`): the kink where a batch
    # stops being weight-bound is the one thing HyGen's polynomial cannot fit, worth ~3.6% here.
    fit = fit_latency(NoisyClock(STEP, jitter=0.0), count=200)
    assert fit.holdout_mape["hygen"] < 0.05


def test_bursty_arrivals_swing_three_times_between_halves() -> None:
    times = arrival_times("bursty", 10.0, 2000.0, 100.0, seed=3)
    high = sum(1 for t in times if t % 100.0 < 50.0)
    low = len(times) - high
    assert high / low == pytest.approx(BURST_HIGH / BURST_LOW, rel=0.1)
    with pytest.raises(ValueError, match="unknown arrival pattern"):
        arrival_times("weekly", 1.0, 10.0, 10.0, seed=0)


class RecordingPolicy:
    """An offline policy that notes the order in which the engine admits its requests."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.admissions: list[str] = []

    def admitted(self, rids) -> None:
        rids = list(rids)
        self.admissions.extend(rids)
        self.policy.admitted(rids)

    def __getattr__(self, name: str):
        return getattr(self.policy, name)


def shots_and_documents(n: int = 400, seed: int = 0) -> list[SimRequest]:
    """FCFS order alternating long unique documents and short questions on one of four 1500-token
    few-shot prefixes (the mix bench/echo_window.py measures)."""
    rng = random.Random(seed)
    shots = [(chain_hash("", f"few-shot-{k}"), 1500) for k in range(4)]
    return [SimRequest(f"doc-{i}", "offline", (), rng.randint(500, 2000), rng.randint(50, 300), 512, False) if i % 2
            else SimRequest(f"shot-{i}", "offline", (shots[(i // 2) % 4],), rng.randint(20, 100), rng.randint(1, 32),
                            64, False)
            for i in range(n)]


def run_echo(latency_model: dict, offline: list[SimRequest], **config) -> tuple[ColocatedResult, RecordingPolicy]:
    controller = ColocationController(ColocationConfig(mode="echo", ttft_slo_s=0.2, tpot_slo_s=0.03,
                                                       latency_model=latency_model))
    policy = RecordingPolicy(make_offline_policy("fcfs", MODEL, HARDWARE))
    engine = ColocatedEngine(NoisyClock(STEP, jitter=0.0), controller, policy,
                             ColocatedConfig(COST.kv_capacity_tokens(), **config))
    return engine.run(online_load(), offline, HORIZON_S), policy


def test_echo_serves_every_online_request_and_its_selector_decides_each_iteration(latency_model: dict) -> None:
    arrivals = online_load()
    result, _ = run_echo(latency_model, offline_pool())
    assert [timing.tokens for timing in result.online] == [a.request.output_len for a in arrivals]
    assert result.offline_tokens_per_s() > 0
    assert result.counts["echo_keep_decode"] > 0 and result.counts["echo_add_prefill"] > 0


def test_echo_admits_past_the_policy_order_and_gains_on_it(latency_model: dict) -> None:
    """With a window of one the selector only ever sees the head of the FCFS order, so it admits in
    that order; with its window it takes questions on a resident few-shot prefix past earlier long
    documents, and the same deadlines yield more offline tokens."""
    offline = shots_and_documents()
    in_order, head_only = run_echo(latency_model, offline, echo_window=1)
    selected, chosen = run_echo(latency_model, offline)
    fcfs = [request.rid for request in offline]
    assert head_only.admissions == fcfs[:len(head_only.admissions)]
    assert chosen.admissions != fcfs[:len(chosen.admissions)]
    assert selected.counts["offline_prefix_hit"] > in_order.counts["offline_prefix_hit"]
    assert selected.offline_tokens_per_s() > in_order.offline_tokens_per_s()
