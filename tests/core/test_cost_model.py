"""Cost-model formulas against hand-computed values, the paper's Figure 6 included."""

from __future__ import annotations

import pytest

from sgl_blend.core.cost_model import (
    BUILTIN_MODELS, CostModel, HardwareSpec, ModelSpec, memory_partition, optimal_time, shared_density,
)

LLAMA_8B_CONFIG = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                   "torch_dtype": "bfloat16", "hidden_act": "silu"}
QWEN2_7B_CONFIG = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "torch_dtype": "bfloat16", "hidden_act": "silu"}
MISTRAL_7B_CONFIG = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                     "head_dim": 128, "torch_dtype": "bfloat16"}


def test_figure_6_memory_partition() -> None:
    left, right = memory_partition(60.0, 1.27, 3.73, 0.096)
    assert left == pytest.approx(19.3, abs=0.1)
    assert right == pytest.approx(40.7, abs=0.1)
    assert left * 3.73 + right * 0.096 == pytest.approx(60.0 * 1.27)


def test_partition_degenerate_cases() -> None:
    assert memory_partition(10.0, 2.0, 1.0, 1.0) == (5.0, 5.0)
    assert memory_partition(10.0, 9.0, 3.0, 1.0) == (10.0, 0.0)
    assert memory_partition(10.0, 0.5, 3.0, 1.0) == (0.0, 10.0)


@pytest.mark.parametrize("config, billions", [(LLAMA_8B_CONFIG, 8.03), (QWEN2_7B_CONFIG, 7.6), (MISTRAL_7B_CONFIG, 7.24)])
def test_hf_configs_give_the_known_parameter_counts(config, billions) -> None:
    spec = ModelSpec.from_hf_config(config)
    assert spec.params / 1e9 == pytest.approx(billions, rel=0.02)
    assert spec.dtype_bytes == 2 and spec.head_dim == 128


def test_request_costs_by_hand() -> None:
    model = ModelSpec("toy", params=1e9, layers=2, hidden=8, kv_heads=1, head_dim=4, dtype_bytes=2)
    cost = CostModel(model, HardwareSpec("toy", flops=1e12, bandwidth=1e9, kv_memory_bytes=1e6))
    assert cost.comp_time(10, 5) == pytest.approx((2 * 15 * 1e9 + 4 * 100 * 8 * 2) / 1e12)
    assert cost.mem_time(10, 5) == pytest.approx((50 + 12.5) * 4 * 2 * 2 * 2 / 1e9)
    assert cost.density(10, 5) == pytest.approx(cost.comp_time(10, 5) / cost.mem_time(10, 5))
    assert cost.kv_capacity_tokens() == int(1e6 // (2 * 2 * 4 * 2))
    assert cost.kv_footprint(10, 5) == 12.5


def test_optimal_time_and_shared_density() -> None:
    assert optimal_time(10.0, 4.0, 0.5) == 5.0
    assert optimal_time(10.0, 6.0, 0.5) == 6.0
    assert shared_density(10.0, 4.0, 5.0) == 1.25
    assert shared_density(10.0, 0.0, 5.0) == float("inf")


def test_a_cached_prefix_saves_exactly_the_prefill_of_its_tokens() -> None:
    """Reusing k of p prompt tokens removes k linear passes and the k^2 / 2 pairs of their own
    attention rows: what is left is the compute of the p - k tokens attending to all p."""
    model = ModelSpec("toy", params=1e9, layers=2, hidden=8, kv_heads=1, head_dim=4, dtype_bytes=2)
    cost = CostModel(model, HardwareSpec("toy", flops=1e12, bandwidth=1e9, kv_memory_bytes=1e6))
    price = cost.sharing_price()
    prompt, output, reused = 100, 7, 60
    left = (2 * (prompt - reused + output) * 1e9 + 8 * 8 * 2 * (prompt ** 2 - reused ** 2) / 2) / 1e12
    assert cost.comp_time(prompt, output) - price.prefix_saving(reused) == pytest.approx(left)
    assert price.saving(3, 0) == pytest.approx(3 * 2e9 / 1e12)


def test_tp_scales_compute_bandwidth_and_memory() -> None:
    single = HardwareSpec.resolve("a100-80g")
    eight = HardwareSpec.resolve("a100-80gx8")
    assert eight.flops == 8 * single.flops and eight.bandwidth == 8 * single.bandwidth
    assert eight.kv_memory_bytes == 8 * single.kv_memory_bytes
    assert CostModel(BUILTIN_MODELS["llama-3.1-70b"], eight).kv_capacity_tokens() > 0


def test_unknown_hardware_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown hardware"):
        HardwareSpec.resolve("tpu-v9")
