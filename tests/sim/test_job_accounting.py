"""`bench.job_accounting`: each term on hand-built forwards, the simulator's per-iteration record
it reads, and an emulated run's iteration log priced as the emulated device prices it."""

from __future__ import annotations

import numpy as np
import pytest

from bench.job_accounting import Forwards, account, from_iteration_log, from_sim
from sgl_blend.core.cost_model import CostModel
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.forward_time.iteration_cost import IterationCost
from sgl_blend.forward_time.overlap import hardware_overlap
from sgl_blend.forward_time.step_time import StepTime
from sgl_blend.sim.metrics import WorkloadBound, workload_bound
from sgl_blend.sim.run import simulate
from sgl_blend.sim.sizing import stock_engine
from sgl_blend.sim.workload import SimRequest, chain_hash

ENGINE = stock_engine("llama-3.1-8b", "h100")
COST = CostModel(ENGINE.model, ENGINE.hardware)
STEP = IterationCost.of(COST)
OVERLAP = hardware_overlap(ENGINE.hardware)


def test_each_term_on_hand_built_forwards() -> None:
    """A mixed forward (2,000 prompt tokens, 10 decodes, memory-bound) and a five-step stretch of
    four decodes (below the knee), for a job whose prompts need only 1,200 tokens computed."""
    comp = np.array([STEP.compute_side(2010, 0.0), 5 * STEP.compute_side(4, 0.0)])
    mem = np.array([1.0, 5 * STEP.memory_side(4000)])
    seconds = np.array([OVERLAP(comp[0], mem[0]), OVERLAP(comp[1] / 5, mem[1] / 5) * 5])
    forwards = Forwards(np.array([1, 5]), np.array([10, 4]), np.array([2000, 0]), comp, mem, seconds)
    bound = WorkloadBound(t_comp=0.5, t_mem=0.8, sharing=0.4, t_o=0.9, t_o_ideal=0.8)
    job = account(forwards, bound, prompt_tokens=2000, cost=STEP, overlap=OVERLAP, idle_s=0.25)

    assert STEP.weight_read / STEP.token_comp == pytest.approx(295, abs=1), "the knee on an H100"
    assert job.forward_s == pytest.approx(seconds.sum()) and job.job_s == pytest.approx(seconds.sum() + 0.25)
    assert job.of_bound == pytest.approx(0.9 / job.job_s)
    assert job.blend_loss_s == pytest.approx(seconds.sum() - OVERLAP(comp.sum(), mem.sum()))
    assert job.blend_loss_s > 0, "one forward is memory-bound, the other compute-bound"
    assert (job.minimum_prefill_tokens, job.recomputed_tokens) == (1200, 800)
    assert job.recompute_comp_s == pytest.approx(800 * STEP.token_comp)
    assert (job.iterations, job.below_knee_iterations) == (6, 5)
    assert job.below_knee_s == pytest.approx(seconds[1])
    assert job.weight_floor_comp_s == pytest.approx(5 * (STEP.weight_read - 4 * STEP.token_comp))
    assert job.comp_excess_s == pytest.approx(comp.sum() - 0.6 * 0.5)
    assert job.mem_excess_s == pytest.approx(mem.sum() - 0.8)
    assert job.other_comp_s == pytest.approx(job.comp_excess_s - job.recompute_comp_s - job.weight_floor_comp_s)


def job() -> list[SimRequest]:
    """Ten requests under one 600-token prefix with short answers, six unique long decodes."""
    prefix = ((chain_hash("", "rubric"), 600),)
    shared = [SimRequest(f"s{i}", "t", prefix, 30, 3, 3, True) for i in range(10)]
    unique = [SimRequest(f"u{i}", "t", (), 200, 400 + 20 * i, 400 + 20 * i, True) for i in range(6)]
    return unique[:3] + shared + unique[3:]


@pytest.mark.parametrize("policy", ["blendserve", "fcfs"])
def test_the_simulators_record_accounts_for_the_whole_run(policy: str) -> None:
    requests = job()
    result = simulate(requests, policy, ENGINE.model, ENGINE.hardware, OVERLAP, config=ENGINE.config)
    bound = workload_bound(requests, COST, OVERLAP)
    prompt = sum(r.prompt_len for r in requests)
    forwards = from_sim(result.trace)
    assert result.retractions == 0
    # every output token but a request's first (sampled by its prefill) is one decode
    assert int((forwards.decodes * forwards.steps).sum()) == result.output_tokens - len(requests)
    assert int(forwards.prefill.sum()) == prompt - result.cached_tokens
    assert forwards.seconds.sum() == pytest.approx(result.seconds)

    job_account = account(forwards, bound, prompt_tokens=prompt, cost=STEP, overlap=OVERLAP)
    assert job_account.forward_s == pytest.approx(result.seconds)
    assert job_account.iterations == result.iterations
    assert job_account.recomputed_tokens == round(bound.sharing * prompt) - result.cached_tokens
    assert job_account.below_knee_iterations > 0, "sixteen requests never fill a weight-bound batch"
    assert job_account.idle_s == 0.0


def test_an_iteration_log_is_priced_as_the_emulated_device_prices_it() -> None:
    step = StepTime.of(COST, OVERLAP)
    shapes = [BatchShape().with_prefill(900, 600).with_prefill(30, 0).with_decode(700),
              BatchShape().with_decode(1200).with_decode(800)]
    records = [{"iteration": index, "mode": "mixed", **shape.to_dict(), "forward_s": 0.5}
               for index, shape in enumerate(shapes)]
    forwards = from_iteration_log(records, step)
    assert list(forwards.steps) == [1, 1]
    assert list(forwards.decodes) == [1, 2] and list(forwards.prefill) == [930, 0]
    assert list(forwards.seconds) == pytest.approx([step.seconds(shape) for shape in shapes])
    sides = [step.sides(shape) for shape in shapes]
    assert list(forwards.comp) == pytest.approx([comp for comp, _mem in sides])
    assert list(forwards.mem) == pytest.approx([mem for _comp, mem in sides])
