"""SGLang's own sizing of a model on a device: the numbers for the emulation's models, worked step by
step, and the user flags SGLang honours."""

from __future__ import annotations

import pytest

from sgl_blend.emulation.devices import resolve_device
from sgl_blend.emulation.memory import engine_sizing, kv_bytes_per_token, prefill_graph_buckets
from sgl_blend.models.llama31 import LLAMA_31_8B, LLAMA_31_70B

H100 = resolve_device("h100").memory
A100 = resolve_device("a100-80g").memory
GIB = 1 << 30


def test_llama_8b_on_an_h100() -> None:
    sizing = engine_sizing(LLAMA_31_8B, H100)
    # 512 + 8192 * 1.5 + 1/8 * 1024 + 256 decode graphs * 2 + 58 prefill buckets * 8
    assert len(prefill_graph_buckets(8192)) == 58
    assert sizing.reserved_mib == 512 + 12288 + 128 + 512 + 464
    assert sizing.mem_fraction_static == round((81559 - 13904) / 81559, 3) == 0.83
    assert sizing.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2
    assert sizing.weight_gib == pytest.approx(8.03e9 * 2 / GIB, rel=1e-3)
    free = 79.11 - (79.11 - 78.43)
    assert sizing.max_total_tokens == int((free * 0.83 - sizing.weight_gib) * GIB) // 131072 == 410745
    assert (sizing.chunked_prefill_size, sizing.decode_graph_max_bs, sizing.max_running_requests) == (8192, 256, 2048)


def test_llama_8b_on_an_a100() -> None:
    sizing = engine_sizing(LLAMA_31_8B, A100)
    assert sizing.mem_fraction_static == round((81920 - 13904) / 81920, 3) == 0.83
    assert sizing.max_total_tokens == 411017
    assert sizing.max_running_requests == 2048


def test_llama_70b_at_tp_8() -> None:
    sizing = engine_sizing(LLAMA_31_70B, H100, tp=8)
    # TP >= 4 captures decode graphs up to 512 and reserves 1024 MiB more for 8 ranks.
    assert sizing.decode_graph_max_bs == 512
    assert sizing.reserved_mib == 512 + 12288 + 1024 + 1024 + 464
    assert sizing.mem_fraction_static == 0.812
    assert sizing.kv_bytes_per_token == kv_bytes_per_token(LLAMA_31_70B, 8) == 1 * 2 * 128 * 80 * 2
    assert sizing.weight_gib == pytest.approx(70.55e9 * 2 / 8 / GIB, rel=1e-3)
    assert sizing.max_total_tokens == 1238850
    assert sizing.max_running_requests == 4096
    assert engine_sizing(LLAMA_31_70B, A100, tp=8).max_total_tokens == 1241759


def test_user_flags_enter_the_sizing_as_sglang_honours_them() -> None:
    default = engine_sizing(LLAMA_31_8B, H100)
    small_chunk = engine_sizing(LLAMA_31_8B, H100, chunked_prefill_size=2048)
    assert small_chunk.chunked_prefill_size == 2048
    assert small_chunk.reserved_mib == 10 * 1024  # the 10 GiB floor of a large device
    assert small_chunk.max_total_tokens > default.max_total_tokens
    assert engine_sizing(LLAMA_31_8B, H100, mem_fraction_static=0.9).mem_fraction_static == 0.9
    assert engine_sizing(LLAMA_31_8B, H100, max_total_tokens=20000).max_total_tokens == 20000
    capped = engine_sizing(LLAMA_31_8B, H100, max_total_tokens=20000, max_running_requests=64)
    assert (capped.max_running_requests, capped.decode_graph_max_bs) == (64, 64)
    assert engine_sizing(LLAMA_31_8B, H100, max_total_tokens=1000).max_running_requests == 500


def test_kv_heads_are_replicated_beyond_their_count() -> None:
    assert kv_bytes_per_token(LLAMA_31_8B, 16) == kv_bytes_per_token(LLAMA_31_8B, 8)


def test_a_model_too_big_for_the_device_is_refused() -> None:
    with pytest.raises(ValueError, match="raise --tp-size"):
        engine_sizing(LLAMA_31_70B, H100, tp=1)


@pytest.mark.parametrize("name, config", [("llama-3.1-8b", LLAMA_31_8B), ("llama-3.1-70b", LLAMA_31_70B)])
def test_the_emulated_shapes_are_the_cost_models_models(name: str, config) -> None:
    from sgl_blend.core.cost_model import ModelSpec, model_spec

    priced, configured = model_spec(name), ModelSpec.from_hf_config(config, name)
    assert (priced.layers, priced.hidden, priced.kv_heads, priced.head_dim, priced.dtype_bytes) == (
        configured.layers, configured.hidden, configured.kv_heads, configured.head_dim, configured.dtype_bytes)
    assert configured.params == pytest.approx(priced.params, rel=1e-3)
