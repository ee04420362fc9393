"""Where a job's time goes: its priced forward time against the engine's bound, term by term.

BlendServe's times on the emulated H100 sit at 0.75-0.92 of the bound and nothing said where the
rest goes (issue 27, "Find where the time goes"). A job's forwards are accounted as:

- **forward**: the priced time of every forward, against the bound: `metrics.workload_bound`'s
  ``t_o`` under the device's overlap, ``max + λ min`` (λ 0.90 on the H100) of the whole job's
  compute time, less what the ideal sharing saves, and memory time;
- **blend loss**: forward time less the overlap of the forwards' summed compute and memory sides:
  each forward pays ``max + λ min`` of its own sides, so this is what spreading the same work
  evenly over the job would save;
- **compute and memory excess**: the forwards' summed compute side over the bound's compute time,
  and their memory side over its memory time. With no blend loss (every forward compute-bound)
  the gap to the bound is exactly the compute excess plus λ times the memory excess. The compute
  excess splits into:
  - **recompute**: prompt tokens prefilled beyond the minimum (each distinct prefix once, the
    ideal of `workloads.ideal_sharing`) at the linear layers' FLOP time: prefixes computed more
    than once, and what retracted requests compute again;
  - **weight floor**: forwards of fewer tokens than the weight-bound knee (weight read over one
    token's FLOP time: 295 tokens for Llama-3.1-8B on an H100), and the compute time their weight
    reads cost beyond their tokens' FLOPs -- small decode batches;
  - **other**: what those two leave;
- **idle**: time the device ran nothing (none in the simulator; an emulated run's clock has it).

Terms are seconds of forward time (forward, blend loss, idle) or of one side (the others).
`account` takes any run's forwards as `Forwards`: the simulator's trace (`from_sim`), or an
emulated run's iteration log (`from_iteration_log`), priced as the emulated device prices a forward.

``python -m bench.job_accounting --workload trace1 --lines 4000 --policies blendserve,dfs,lpm``
runs the simulator on a stock H100 engine; ``--workload`` takes an OpenAI batch file too.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from sgl_blend.core.cost_model import CostModel
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.forward_time.iteration_cost import IterationCost
from sgl_blend.forward_time.overlap import OverlapFunction, hardware_overlap
from sgl_blend.forward_time.step_time import StepTime
from sgl_blend.sim.batch_file import load_batch_file
from sgl_blend.sim.metrics import StepTrace, WorkloadBound, workload_bound
from sgl_blend.sim.run import simulate
from sgl_blend.sim.sizing import stock_engine
from sgl_blend.sim.workload import SimRequest
from sgl_blend.workloads.paper_lines import paper_requests


@dataclass(frozen=True)
class Forwards:
    """A run's forwards, one row per record: ``steps`` identical forwards (a closed-form decode
    stretch is one record), the requests decoding in each, the prompt tokens prefilled over all,
    and the record's compute side, memory side and priced seconds."""

    steps: np.ndarray
    decodes: np.ndarray
    prefill: np.ndarray
    comp: np.ndarray
    mem: np.ndarray
    seconds: np.ndarray


def from_sim(trace: StepTrace) -> Forwards:
    """The simulator's per-iteration record (`SimResult.trace`)."""
    return Forwards(*(np.asarray(column) for column in (trace.steps, trace.decodes, trace.prefill, trace.comp,
                                                          trace.mem, trace.seconds)))


def from_iteration_log(records: Iterable[dict[str, Any]], step: StepTime) -> Forwards:
    """An emulated run's iteration log (`sglang_plugin.iteration_log` records, one a forward),
    each forward priced by ``step`` as the emulated device prices it (`emulation.pricing`)."""
    rows = []
    for record in records:
        shape = BatchShape.from_dict(record)
        comp, mem = step.sides(shape)
        rows.append((1, shape.decode_reqs, shape.prefill_tokens, comp, mem, step.seconds(shape)))
    columns = list(zip(*rows)) if rows else [()] * 6
    return Forwards(*(np.asarray(column, dtype=float) for column in columns))


@dataclass(frozen=True)
class JobAccount:
    forward_s: float
    bound_s: float
    idle_s: float
    blend_loss_s: float
    comp_excess_s: float
    mem_excess_s: float
    prefill_tokens: int
    minimum_prefill_tokens: int
    recompute_comp_s: float
    knee_tokens: float
    iterations: int
    below_knee_iterations: int
    below_knee_s: float
    weight_floor_comp_s: float

    @property
    def job_s(self) -> float:
        return self.forward_s + self.idle_s

    @property
    def of_bound(self) -> float:
        """The bound over the job's time: 1 reaches it."""
        return self.bound_s / self.job_s if self.job_s else 0.0

    @property
    def recomputed_tokens(self) -> int:
        return max(0, self.prefill_tokens - self.minimum_prefill_tokens)

    @property
    def other_comp_s(self) -> float:
        """The compute excess that neither recompute nor the weight floor explains."""
        return self.comp_excess_s - self.recompute_comp_s - self.weight_floor_comp_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "job_s": self.job_s, "of_bound": self.of_bound,
                "recomputed_tokens": self.recomputed_tokens, "other_comp_s": self.other_comp_s}


def account(forwards: Forwards, bound: WorkloadBound, *, prompt_tokens: int, cost: IterationCost,
            overlap: OverlapFunction, idle_s: float = 0.0) -> JobAccount:
    """``forwards`` of a job whose prompts hold ``prompt_tokens`` and whose ``bound`` (under
    ``overlap``) has the ideal sharing ratio: each shared prefix computed once."""
    tokens = forwards.decodes * forwards.steps + forwards.prefill
    per_step = np.divide(tokens, forwards.steps, out=np.zeros(len(tokens)), where=forwards.steps > 0)
    knee = cost.weight_read / cost.token_comp
    small = (per_step > 0) & (per_step < knee)
    prefill = int(forwards.prefill.sum())
    minimum = prompt_tokens - round(bound.sharing * prompt_tokens)
    forward_s = float(forwards.seconds.sum())
    comp, mem = float(forwards.comp.sum()), float(forwards.mem.sum())
    return JobAccount(
        forward_s=forward_s, bound_s=bound.t_o, idle_s=idle_s, blend_loss_s=forward_s - overlap(comp, mem),
        comp_excess_s=comp - (1 - bound.sharing) * bound.t_comp, mem_excess_s=mem - bound.t_mem,
        prefill_tokens=prefill, minimum_prefill_tokens=minimum,
        recompute_comp_s=max(0, prefill - minimum) * cost.token_comp,
        knee_tokens=knee, iterations=int(forwards.steps.sum()),
        below_knee_iterations=int(forwards.steps[small].sum()), below_knee_s=float(forwards.seconds[small].sum()),
        weight_floor_comp_s=float((forwards.steps[small] * cost.weight_read - tokens[small] * cost.token_comp).sum()))


def table(accounts: dict[str, JobAccount]) -> str:
    header = (f"{'policy':<18} {'job s':>8} {'bound s':>8} {'of bound':>8} {'blend loss s':>12} "
              f"{'comp excess s':>13} {'mem excess s':>12} "
              f"{'recomputed tok':>14} {'recompute s':>11} {'<knee iters':>11} {'<knee s':>8} "
              f"{'weight floor s':>14} {'other comp s':>12} {'idle s':>7}")
    rows = [header]
    for name, job in accounts.items():
        rows.append(f"{name:<18} {job.job_s:>8.1f} {job.bound_s:>8.1f} {job.of_bound:>8.3f} {job.blend_loss_s:>12.1f} "
                    f"{job.comp_excess_s:>13.1f} {job.mem_excess_s:>12.1f} "
                    f"{job.recomputed_tokens:>14,} {job.recompute_comp_s:>11.1f} {job.below_knee_iterations:>11,} "
                    f"{job.below_knee_s:>8.1f} {job.weight_floor_comp_s:>14.1f} {job.other_comp_s:>12.1f} "
                    f"{job.idle_s:>7.1f}")
    return "\n".join(rows)


def job_requests(workload: str, lines: int, cost: CostModel, model: str, seed: int) -> list[SimRequest]:
    """A batch file's lines as `sgl-blend estimate` reads them, or a named workload at ``lines``
    as the shipped-path bench writes it (`paper_requests`: OpenVid's outputs scaled to the run)."""
    if Path(workload).is_file():
        return load_batch_file(Path(workload), model).requests
    return paper_requests(workload, lines, cost, seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="trace1", help="trace1..trace4, DENSITY:SHARING, or a batch file")
    parser.add_argument("--lines", type=int, default=4000, help="lines of a generated workload")
    parser.add_argument("--policies", default="blendserve,dfs,lpm", help="simulator orders, comma-separated")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--device", default="h100")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    engine = stock_engine(args.model, args.device)
    cost = CostModel(engine.model, engine.hardware)
    overlap = hardware_overlap(engine.hardware)
    requests = job_requests(args.workload, args.lines, cost, args.model, args.seed)
    bound = workload_bound(requests, cost, overlap)
    prompt = sum(request.prompt_len for request in requests)
    accounts = {}
    for name in args.policies.split(","):
        result = simulate(requests, name, engine.model, engine.hardware, overlap, seed=args.seed, config=engine.config)
        accounts[name] = account(from_sim(result.trace), bound, prompt_tokens=prompt, cost=IterationCost.of(cost),
                                 overlap=overlap)
    if args.json:
        print(json.dumps({"workload": args.workload, "requests": len(requests), "hardware": engine.hardware.name,
                          "overlap": overlap.name, "policies": {name: job.to_dict() for name, job in accounts.items()}},
                         indent=2))
    else:
        print(f"{args.workload}: {len(requests)} requests, {engine.model.name} on {engine.hardware.name} "
              f"({overlap.name}), simulated")
        print(table(accounts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
