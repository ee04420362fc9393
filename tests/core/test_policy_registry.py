"""The policy registry is the one source of every surface's choices, and every name it lists runs."""

import pytest

from sgl_blend.cli import build_parser
from sgl_blend.core.cost_model import HardwareSpec, model_spec
from sgl_blend.core.policy_registry import REGISTRY, RUN_BATCH, SERVE, SIM, lookup, names_for
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.sim.run import make_sim_policy


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
