"""Echo's selector in the simulator: how many candidates it should weigh, and what picking adds.

The engine is `sgl_blend.sim.colocation` on Llama-3.1-8B / H100 (`StepTime`), every run in echo
mode with the same deadlines, the latency model fitted on simulated batches as the sim tests fit
it. Online load: Poisson arrivals of short chats. Offline load, in FCFS order, alternates two
kinds of request, as a batch mixing an evaluation suite and long documents does:

- *few-shot*: one of four long few-shot prefixes (1,500 tokens) and a short question, short answer;
- *document*: a long unique prompt (500-2,000 tokens) and a longer answer.

Window 1 is admission in the policy's order (the selector sees only the head), so it is the
ablation of the selection itself. For each window the report gives the offline throughput
(prompt tokens once, cached or not, and output tokens, before the online trace ends), the
online latencies, and the selector's cost: wall time per `choose_offline` call on this machine,
and the whole Echo plan (`begin` + `choose_offline`) per iteration against the simulated
iteration time.

    flock /tmp/sglblend-cpu.lock python -m bench.echo_window   # writes bench/results/echo_window.{json,md}
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from sgl_blend.core.colocation import ColocationConfig, ColocationController
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.measure.online_replay import summarize
from sgl_blend.sim.colocation import ColocatedConfig, ColocatedEngine, OnlineArrival
from sgl_blend.forward_time.overlap import overlap_function
from sgl_blend.forward_time.step_time import NoisyClock, StepTime, fit_latency
from sgl_blend.sim.workload import SimRequest, chain_hash
from sgl_blend.workloads.arrivals import arrival_times

RESULTS = Path(__file__).parent / "results"
WINDOWS = (1, 2, 4, 8, 16, 32, 64)


class TimedController(ColocationController):
    """The real controller, timing its own planning calls."""

    def __init__(self, config: ColocationConfig) -> None:
        super().__init__(config)
        self.begin_s: list[float] = []
        self.choose_s: list[float] = []

    def begin(self, view):
        started = time.perf_counter()
        plan = super().begin(view)
        self.begin_s.append(time.perf_counter() - started)
        return plan

    def choose_offline(self, plan, candidates, **kwargs):
        started = time.perf_counter()
        admit = super().choose_offline(plan, candidates, **kwargs)
        self.choose_s.append(time.perf_counter() - started)
        return admit


def online_load(rate: float, horizon_s: float, seed: int) -> list[OnlineArrival]:
    rng = random.Random(seed)
    return [OnlineArrival(at, SimRequest(f"on-{i}", "online", (), rng.randint(50, 900), rng.randint(20, 200), 4096,
                                         False))
            for i, at in enumerate(arrival_times("poisson", rate, horizon_s, horizon_s, seed))]


def offline_pool(count: int, seed: int) -> list[SimRequest]:
    rng = random.Random(seed)
    shots = [(chain_hash("", f"few-shot-{k}"), 1500) for k in range(4)]
    pool = []
    for i in range(count):
        if i % 2:
            pool.append(SimRequest(f"doc-{i}", "offline", (), rng.randint(500, 2000), rng.randint(50, 300), 512, False))
        else:
            pool.append(SimRequest(f"shot-{i}", "offline", (shots[(i // 2) % 4],), rng.randint(20, 100),
                                   rng.randint(1, 32), 64, False))
    return pool


def run(args: argparse.Namespace, latency_model: dict[str, Any], window: int, policy: str) -> dict[str, Any]:
    cost = CostModel(model_spec("llama-3.1-8b"), HardwareSpec.resolve("h100-sxm"))
    step = StepTime.of(cost, overlap_function("sum"))
    controller = TimedController(ColocationConfig(mode="echo", ttft_slo_s=args.ttft, tpot_slo_s=args.tpot,
                                                  latency_model=latency_model))
    engine = ColocatedEngine(NoisyClock(step, jitter=0.0), controller,
                             make_offline_policy(policy, cost.model, cost.hardware),
                             ColocatedConfig(cost.kv_capacity_tokens(), chunk_tokens=args.chunk, echo_window=window))
    result = engine.run(online_load(args.rate, args.duration, args.seed), offline_pool(args.offline, args.seed),
                        args.duration)
    online = summarize(result.online)
    plan_s = [b + c for b, c in zip(controller.begin_s, controller.choose_s)]
    return {"window": window, "policy": policy, "offline_tokens_per_s": round(result.offline_tokens_per_s(), 1),
            "ttft_p99_s": round(online["ttft_p99"], 4), "tbt_p99_s": round(online["tbt_p99"], 4),
            "completed_online": online["completed"], "iterations": result.iterations,
            "mean_iteration_s": round(result.seconds / result.iterations, 6),
            "choose_mean_ms": round(1e3 * float(np.mean(controller.choose_s)), 4),
            "choose_p99_ms": round(1e3 * float(np.percentile(controller.choose_s, 99)), 4),
            "plan_mean_ms": round(1e3 * float(np.mean(plan_s)), 4),
            "plan_share_of_iteration": round(float(np.mean(plan_s)) / (result.seconds / result.iterations), 4),
            "prefix_hit_tokens": result.counts["offline_prefix_hit"],
            "prefill_computed_tokens": result.counts["offline_prefill_computed"],
            "echo": {key: value for key, value in result.counts.items() if key.startswith("echo_")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=6.0, help="online requests per second")
    parser.add_argument("--duration", type=float, default=20.0, help="online trace length (s)")
    parser.add_argument("--offline", type=int, default=4000, help="offline requests in the pool")
    parser.add_argument("--ttft", type=float, default=0.2)
    parser.add_argument("--tpot", type=float, default=0.03)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", nargs="+", default=["fcfs", "psm"])
    args = parser.parse_args()
    cost = CostModel(model_spec("llama-3.1-8b"), HardwareSpec.resolve("h100-sxm"))
    latency_model = fit_latency(NoisyClock(StepTime.of(cost, overlap_function("sum")), jitter=0.0),
                                count=200).models["hygen"].to_dict()
    rows = [run(args, latency_model, window, policy) for policy in args.policies for window in WINDOWS]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "echo_window.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    header = ("| policy | window | offline tok/s | TTFT P99 (s) | TBT P99 (s) | prefix hit / computed tokens | "
              "choose mean / P99 (ms) | plan per iteration (ms) | share of a simulated iteration |")
    lines = [header, "|" + "---|" * 9]
    for row in rows:
        lines.append(f"| {row['policy']} | {row['window']} | {row['offline_tokens_per_s']} | {row['ttft_p99_s']} | "
                     f"{row['tbt_p99_s']} | {row['prefix_hit_tokens']} / {row['prefill_computed_tokens']} | "
                     f"{row['choose_mean_ms']} / {row['choose_p99_ms']} | {row['plan_mean_ms']} | "
                     f"{row['plan_share_of_iteration']:.1%} |")
    (RESULTS / "echo_window.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
