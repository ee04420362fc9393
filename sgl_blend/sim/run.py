"""One simulation by name: a workload, a policy, a model on a device, an overlap function.

A simulation runs a job the way run-batch and the Batch API run it (`feed.RunnerFeed`): a planned
order is planned over the whole batch before anything is sent, and its lines go to the engine in
plan order through the runner's window, each with its placement, for the policy inside the engine
to admit by; other orders go in file order. Every policy runs on the same engine, cost model and
limits; only the order, the plan and whether the engine's policy paces prefill differ. The core's
policies come from `make_offline_policy`, as the plugin builds them; SGLang's LPM is the
simulator's own. Ablation variants separate BlendServe's mechanisms, so none can take credit for
another:

- ``dfs+pacing``: DFS order with BlendServe's Alg. 3 prefill pacing;
- ``blendserve-order``: BlendServe's order (sort, split, dual scan) without the pacing;
- ``blendserve-serial``: BlendServe's order (sort, split) walked by one cursor, without its dual
  scan and pacing: what blending itself adds;
- ``fcfs-shuffled``: FCFS over a seeded shuffle of the submission order (NanoFlow-Balance).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from sgl_blend.batch_lines.plan import LinePlanner
from sgl_blend.core.cost_model import CostModel, HardwareSpec, ModelSpec
from sgl_blend.core.policies import PlannedPolicy
from sgl_blend.core.policy_registry import SIM, lookup, names_for
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.forward_time.overlap import OverlapFunction
from sgl_blend.sim.engine import EngineConfig, SimEngine
from sgl_blend.sim.feed import RunnerFeed, runner_window
from sgl_blend.sim.lpm_policy import SGLangLPMPolicy
from sgl_blend.sim.metrics import SimResult
from sgl_blend.sim.workload import SimRequest

SIM_POLICIES = names_for(SIM)


def make_sim_policy(name: str, model: ModelSpec, hardware: HardwareSpec, seed: int = 0) -> PlannedPolicy:
    """The policy (or ablation variant) ``name``, as the plugin builds it (`make_offline_policy`)."""
    entry = lookup(name, SIM)
    if entry.name == SGLangLPMPolicy.name:
        return SGLangLPMPolicy(CostModel(model, hardware), seed=seed)
    return make_offline_policy(name, model, hardware, seed=seed)


def submission_order(requests: Sequence[SimRequest], policy_name: str, seed: int) -> list[SimRequest]:
    """The order requests reach the policy: a seeded shuffle for ``fcfs-shuffled``, else as given."""
    ordered = list(requests)
    if lookup(policy_name, SIM).shuffled:
        random.Random(seed).shuffle(ordered)
    return ordered


def simulate(
    requests: Sequence[SimRequest],
    policy_name: str,
    model: ModelSpec,
    hardware: HardwareSpec,
    overlap: OverlapFunction,
    *,
    seed: int = 0,
    config: EngineConfig = EngineConfig(),
    on_finish: Callable[[int], None] | None = None,
    also_price: Sequence[OverlapFunction] = (),
    window: int | None = None,
) -> SimResult:
    """Run ``policy_name`` over ``requests`` (a batch file's lines, in file order) as the runner
    feeds them through ``window`` lines in flight (None: the runner's own, `runner_window`);
    ``also_price`` prices the same schedule under more overlap functions (`SimResult.seconds_under`)."""
    cost = CostModel(model, hardware)
    engine = SimEngine(cost, make_sim_policy(policy_name, model, hardware, seed), overlap, config, also_price)
    ordered = submission_order(requests, policy_name, seed)
    planner = LinePlanner.for_policy(policy_name, cost)
    feed = RunnerFeed(ordered, planner, window or runner_window(ordered, config, engine.capacity), seed)
    return engine.run(ordered, feed, on_finish)
