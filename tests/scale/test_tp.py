"""TP in the cost model: a scheduler of a TP group plans with the group's compute, bandwidth and KV
memory (the paper's Llama-3.1-70B on 8 x A100), and the DP partition is unchanged by it."""

from __future__ import annotations

import pytest

from sgl_blend.core.cost_model import BUILTIN_MODELS, CostModel, HardwareSpec
from sgl_blend.core.dp_shares import WorkItem, plan_shares
from sgl_blend.sglang_plugin.settings import PluginSettings, configured_hardware


def test_the_scheduler_scales_the_named_device_by_its_tp_degree() -> None:
    settings = PluginSettings(hardware="h100-sxm")
    assert settings.device(4) == HardwareSpec.resolve("h100-sxmx4")
    assert configured_hardware(8, "a100-80g") == HardwareSpec.resolve("a100-80gx8")
    assert settings.device() == HardwareSpec.resolve("h100-sxm")


def test_70b_on_eight_a100s() -> None:
    model = BUILTIN_MODELS["llama-3.1-70b"]
    one = CostModel(model, HardwareSpec.resolve("a100-80g"))
    eight = CostModel(model, configured_hardware(8, "a100-80g"))
    assert eight.kv_capacity_tokens() == pytest.approx(8 * one.kv_capacity_tokens(), abs=8)
    assert eight.comp_time(2000, 200) == pytest.approx(one.comp_time(2000, 200) / 8)
    assert eight.mem_time(2000, 200) == pytest.approx(one.mem_time(2000, 200) / 8)
    assert eight.density(2000, 200) == pytest.approx(one.density(2000, 200))
    items = [WorkItem(index, [index % 5] * 50 + [index] * (10 + index), 20 + 7 * index) for index in range(40)]
    assert plan_shares(items, 2, one).shares == plan_shares(items, 2, eight).shares
