"""One simulation by name: a workload, a policy, a model on a device, an overlap function.

Every policy runs on the same engine and cost model; only the order the policy asks for
differs. The core's policies come from `make_policy`; SGLang's LPM is the simulator's own.
"""

from __future__ import annotations

from typing import Callable, Sequence

from sgl_blend.core.cost_model import CostModel, HardwareSpec, ModelSpec
from sgl_blend.core.policies import POLICIES, PlannedPolicy, make_policy
from sgl_blend.sim.engine import EngineConfig, SimEngine
from sgl_blend.sim.lpm_policy import SGLangLPMPolicy
from sgl_blend.sim.metrics import SimResult
from sgl_blend.sim.overlap import OverlapFunction
from sgl_blend.sim.workload import SimRequest

SIM_POLICIES = (*POLICIES, SGLangLPMPolicy.name)


def make_sim_policy(name: str, model: ModelSpec, hardware: HardwareSpec, seed: int = 0) -> PlannedPolicy:
    if name == SGLangLPMPolicy.name:
        return SGLangLPMPolicy(CostModel(model, hardware), seed=seed)
    return make_policy(name, model, hardware, seed=seed)


def simulate(requests: Sequence[SimRequest], policy_name: str, model: ModelSpec, hardware: HardwareSpec,
             overlap: OverlapFunction, *, seed: int = 0, config: EngineConfig = EngineConfig(),
             on_finish: Callable[[int], None] | None = None) -> SimResult:
    policy = make_sim_policy(policy_name, model, hardware, seed)
    return SimEngine(CostModel(model, hardware), policy, overlap, config).run(requests, on_finish)
