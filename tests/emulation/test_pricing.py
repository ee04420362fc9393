"""A forward's price is the simulator's step price of its exact shape, on known shapes worked by hand;
the shape is read from SGLang's batch fields as SGLang lays out prefill, decode and mixed batches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgl_blend.core.cost_model import TWO_STREAM_INTERFERENCE, CostModel, HardwareSpec, model_spec
from sgl_blend.emulation.devices import resolve_device
from sgl_blend.emulation.pricing import ForwardPricer, batch_shape
from sgl_blend.emulation.sglang_forward import read_batch
from sgl_blend.forward_time.overlap import overlap_function
from sgl_blend.forward_time.step_time import StepTime

LLAMA_8B = model_spec("llama-3.1-8b")
H100 = HardwareSpec.resolve("h100-sxm")


def by_hand(model, hardware, tokens: int, pairs: float, context: int, interference: float) -> float:
    """Linear layers at max(FLOP time, weight read) plus 8 H L FLOPs per causal attention pair (a
    cold prompt of p tokens: the cost model's 4 p^2 H L); decode KV reads; ``max + lambda min``."""
    linear = max(tokens * 2 * model.params / hardware.flops, model.params * model.dtype_bytes / hardware.bandwidth)
    comp = linear + pairs * 8 * model.hidden * model.layers / hardware.flops
    mem = context * model.kv_bytes_per_token / hardware.bandwidth
    return max(comp, mem) + interference * min(comp, mem)


@pytest.mark.parametrize("extends, contexts", [
    ([(8192, 0)], []),
    ([(512, 3584)], []),
    ([], [1000] * 256),
    ([(2047, 100), (1, 5000)], [300, 7000, 12000]),
])
def test_prices_are_the_cost_model_on_the_emulated_h100(extends, contexts) -> None:
    pricer = ForwardPricer.of(resolve_device("h100"), "llama-3.1-8b", tp=1)
    shape = batch_shape(extends, contexts)
    tokens = sum(extend for extend, _ in extends) + len(contexts)
    pairs = sum(extend * prefix + extend * (extend + 1) / 2 for extend, prefix in extends)
    expected = by_hand(LLAMA_8B, H100, tokens, pairs, sum(contexts), TWO_STREAM_INTERFERENCE)
    assert pricer.seconds(shape) == pytest.approx(expected, rel=1e-12)
    assert pricer.seconds(shape) == StepTime.of(CostModel(LLAMA_8B, H100), overlap_function("interference")).seconds(shape)


def test_tp_prices_a_group_of_devices() -> None:
    pricer = ForwardPricer.of(resolve_device("a100-80g"), "llama-3.1-70b", tp=8)
    group = HardwareSpec.resolve("a100-80g").scaled(8)
    shape = batch_shape([(4096, 0)], [2000] * 64)
    expected = by_hand(model_spec("llama-3.1-70b"), group, 4096 + 64, 4096 * 4097 / 2, 2000 * 64, TWO_STREAM_INTERFERENCE)
    assert pricer.hardware_name == "a100-80gx8"
    assert pricer.seconds(shape) == pytest.approx(expected, rel=1e-12)


def test_a_small_decode_batch_costs_a_weight_read() -> None:
    pricer = ForwardPricer.of(resolve_device("h100"), "llama-3.1-8b", tp=1)
    weight_read = LLAMA_8B.params * 2 / H100.bandwidth
    one = pricer.seconds(batch_shape(decode_contexts=[10]))
    assert weight_read < one < weight_read * 1.01
    assert pricer.seconds(batch_shape(decode_contexts=[10] * 8)) < one * 1.01


def test_the_cpu_profile_prices_without_overlap() -> None:
    pricer = ForwardPricer.of(resolve_device("cpu"), "llama-3.1-8b", tp=1)
    cpu = HardwareSpec.resolve("cpu")
    assert pricer.seconds(batch_shape([(64, 0)], [100])) == pytest.approx(
        by_hand(LLAMA_8B, cpu, 65, 64 * 65 / 2, 100, cpu.corun_interference), rel=1e-12)


def batch(mode: str, **fields) -> SimpleNamespace:
    return SimpleNamespace(forward_mode=SimpleNamespace(name=mode), **fields)


def test_a_prefill_batch_reads_each_requests_extend_and_cached_prefix() -> None:
    kind, shape = read_batch(batch("EXTEND", extend_lens=[8192, 30], prefix_lens=[0, 600]))
    assert kind == "prefill"
    assert shape == batch_shape([(8192, 0), (30, 600)])


def test_a_decode_batch_reads_each_requests_length() -> None:
    kind, shape = read_batch(batch("DECODE", seq_lens_cpu=torch.tensor([41, 7000]), seq_lens=None))
    assert kind == "decode"
    assert shape == batch_shape(decode_contexts=[41, 7000])


def test_a_mixed_batch_reads_its_trailing_rows_as_decodes() -> None:
    mixed = batch("MIXED", extend_lens=[8191, 1, 1], prefix_lens=[0, 40, 900],
                  mix_running_indices_cpu=torch.tensor([3, 4]))
    kind, shape = read_batch(mixed)
    assert kind == "mixed"
    assert shape == batch_shape([(8191, 0)], [41, 901])


def test_other_forwards_are_not_priced() -> None:
    assert read_batch(batch("IDLE")) is None
    assert read_batch(batch("TARGET_VERIFY")) is None
    assert read_batch(None) is None
