"""The policy registry is the one source of every surface's choices, and every name it lists runs."""

import random

import pytest

from sgl_blend.batch_lines.plan import LinePlanner
from sgl_blend.cli import build_parser
from sgl_blend.core.batch_plan import BatchPlan
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.policy_registry import REGISTRY, RUN_BATCH, SERVE, SIM, lookup, names_for
from sgl_blend.core.protocol import OfflineRequest
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.sglang_plugin.settings import PluginSettings
from sgl_blend.sim.run import make_sim_policy

COST = CostModel(model_spec("llama-3.1-8b"), HardwareSpec.resolve("h100-sxm"))


def _choices(command: str, flag: str) -> tuple[str, ...]:
    subparsers = next(action for action in build_parser()._actions if action.dest == "command")
    option = next(action for action in subparsers.choices[command]._actions if flag in action.option_strings)
    return tuple(option.choices)


def test_serve_and_run_batch_offer_exactly_the_registry_names() -> None:
    assert _choices("serve", "--offline-policy") == names_for(SERVE)
    assert _choices("run-batch", "--policy") == names_for(RUN_BATCH)


def test_every_plugin_policy_is_constructible_where_it_is_offered() -> None:
    model, hardware = model_spec("llama-3.1-8b"), HardwareSpec.resolve("a100-80g")
    for surface in (SERVE, RUN_BATCH):
        for name in names_for(surface):
            if REGISTRY[name].in_plugin:
                assert make_offline_policy(name, model, hardware).name == name
    for name in names_for(SIM):
        assert make_sim_policy(name, model, hardware).name == name


def test_one_meaning_per_name() -> None:
    assert REGISTRY["fcfs"].in_plugin and SERVE in REGISTRY["fcfs"].surfaces and RUN_BATCH in REGISTRY["fcfs"].surfaces
    assert not REGISTRY["lpm"].in_plugin and REGISTRY["lpm"].sglang_schedule == "lpm"


def test_a_name_outside_its_surface_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="known: blendserve, dfs"):
        lookup("dfs+pacing", RUN_BATCH)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        lookup("nope", SIM)


def _mixed_lines() -> list[WorkItem]:
    """Long prompts with short answers and short prompts with long outputs, all exact."""
    rng = random.Random(0)
    lines = [WorkItem(index, [rng.randrange(1, 30000) for _ in range(1500)], 8, True) for index in range(40)]
    lines += [WorkItem(index, [rng.randrange(1, 30000) for _ in range(30)], 1500, True) for index in range(40, 80)]
    return lines


def test_blendserves_ablations_run_everywhere_with_its_plan_and_engine_flags() -> None:
    blendserve = PluginSettings(offline_policy="blendserve", hardware="h100-sxm").sglang_flags()
    for name in ("blendserve-order", "blendserve-serial"):
        assert all(name in names_for(surface) for surface in (SERVE, RUN_BATCH, SIM))
        assert PluginSettings(offline_policy=name, hardware="h100-sxm").sglang_flags() == blendserve
        assert LinePlanner.for_policy(name, COST).blend


def test_the_serial_ablation_walks_blendserves_order_with_one_cursor_and_no_pacing() -> None:
    """The runner plans it as BlendServe's order with every line on the compute side, fed in
    that order; the pool scans the whole order with one cursor and paces nothing."""
    lines = _mixed_lines()
    blended = LinePlanner.for_policy("blendserve", COST).plan(lines, sample_rate=0.0)
    serial = LinePlanner.for_policy("blendserve-serial", COST).plan(lines, sample_rate=0.0)
    assert blended.blended and not serial.blended

    def by_position(plan: BatchPlan) -> list[int]:
        return sorted(plan.placements, key=lambda key: plan.placements[key].position)

    assert by_position(serial) == by_position(blended) == serial.feed
    requests = [OfflineRequest(f"r{line.key}", tuple(line.prompt_ids), line.max_new_tokens, True) for line in lines]
    plans = {}
    for name in ("blendserve", "blendserve-serial"):
        policy = make_offline_policy(name, COST.model, COST.hardware, sample_rate=0.0)
        policy.set_kv_capacity(10**6)
        policy.submit(requests)
        policy.propose(10**6, 8)
        plans[name] = (policy.last_plan, policy.paces_prefill)
    (blend_plan, blend_paced), (serial_plan, serial_paced) = plans["blendserve"], plans["blendserve-serial"]
    assert serial_plan.order == blend_plan.order and blend_plan.boundary < len(blend_plan.order)
    assert serial_plan.boundary == len(serial_plan.order)
    assert blend_paced and not serial_paced
