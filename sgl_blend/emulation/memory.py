"""How a stock SGLang 0.5.23 server sizes itself on a GPU, so the emulated engine is configured alike.

The emulated server runs a tiny model on a CPU, so SGLang's own sizing would describe this machine;
this module redoes it for the emulated device and model, and the launcher passes the results as
flags (``--chunked-prefill-size``, ``--max-running-requests``, ``--max-total-tokens``). Each step
follows SGLang's code, cited at its constants:

1. ``arg_groups/memory_hook.py`` `handle_gpu_memory_settings`: the device's memory tier picks the
   chunked-prefill size and the decode CUDA-graph batch size; the memory reserved for activations
   and CUDA graphs gives ``mem_fraction_static = round((total - reserved) / total, 3)``;
2. ``mem_cache/kv_cache_configurator.py`` `_profile_available_bytes`: the KV budget is what is free
   after the weights load, less ``pre_model_load_memory * (1 - mem_fraction_static)``;
3. ``model_executor/pool_configurator.py`` `DefaultPoolConfigurator`: tokens = budget // per-token
   KV bytes of one TP rank (``max(1, kv_heads // tp) * 2 * head_dim * layers * dtype bytes``);
4. ``kv_cache_configurator.py`` `resolve_max_num_reqs`: ``max_running_requests`` from the pool.

Not modelled: memory taken between SGLang's measurement and the KV pool other than the weights,
NCCL buffers of a TP group beyond the TP-1 start-up overhead (`devices.STARTUP_OVERHEAD_GIB`), and
post-capture KV sizing (off by default: ``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sgl_blend.core.cost_model import ModelSpec
from sgl_blend.emulation.devices import DeviceMemory

MIB_PER_GIB = 1024
BYTES_PER_GIB = 1 << 30
# memory_hook.py: (upper bound of the tier in MiB, chunked_prefill_size, decode graph max_bs at
# tp < 4, at tp >= 4). H100 and A100-80G both fall in the [60, 90) GiB tier.
MEMORY_TIERS: tuple[tuple[float, int, int, int], ...] = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 4096, 48, 160),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (float("inf"), 16384, 512, 512),
)
LARGE_TP = 4
# memory_hook.py, the reserve in MiB: "Constant meta data + activation slack" 512, 1.5 MiB per
# activation token (at least 2048 tokens), 1024 per 8 TP x PP ranks, and a 10 GiB floor on a
# device above 60 GiB; reserve_for_graph_mb: 2 MiB per decode graph batch size (decode graphs on by
# default) and 8 MiB per captured prefill bucket (breakable prefill graphs, CUDA's default).
RESERVED_BASE_MIB = 512
ACTIVATION_MIB_PER_TOKEN = 1.5
MIN_ACTIVATION_TOKENS = 2048
# server_args.py: --max-prefill-tokens' default, the activation size when chunked prefill is off.
DEFAULT_MAX_PREFILL_TOKENS = 16384
PARALLEL_MIB_PER_8_RANKS = 1024
LARGE_DEVICE_MIB = 60 * 1024
LARGE_DEVICE_MIN_RESERVED_MIB = 10 * 1024
DECODE_GRAPH_MIB_PER_BS = 2
PREFILL_GRAPH_MIB_PER_BUCKET = 8
# kv_cache_configurator.py resolve_max_num_reqs: int(tokens / context_len * 512), within [2048, 4096],
# and at most half the pool.
RUNNING_REQUESTS_PER_CONTEXT = 512
MIN_ESTIMATED_RUNNING = 2048
MAX_ESTIMATED_RUNNING = 4096
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def prefill_graph_buckets(max_bs: int) -> list[int]:
    """The token counts SGLang captures prefill graphs at, up to ``max_bs`` (``cuda_graph_hook.py``
    `generate_prefill_cuda_graph_batch_sizes`)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1024 + 1, 64))
        + list(range(1280, 4096 + 1, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return [size for size in sizes if size <= max_bs]


@dataclass(frozen=True)
class EngineSizing:
    """What a stock server of the model picks on the device, and the figures it came from."""

    chunked_prefill_size: int
    decode_graph_max_bs: int
    reserved_mib: float
    mem_fraction_static: float
    free_at_load_gib: float
    weight_gib: float
    kv_bytes_per_token: int
    max_total_tokens: int
    max_running_requests: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_bytes_per_token(config: Mapping[str, Any], tp: int) -> int:
    """One token's K and V on one TP rank; KV heads are replicated when TP exceeds them."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return max(1, kv_heads // tp) * 2 * head_dim * int(config["num_hidden_layers"]) * _dtype_bytes(config)


def engine_sizing(
    config: Mapping[str, Any],
    memory: DeviceMemory,
    tp: int = 1,
    *,
    chunked_prefill_size: int | None = None,
    max_running_requests: int | None = None,
    mem_fraction_static: float | None = None,
    max_total_tokens: int | None = None,
) -> EngineSizing:
    """SGLang's sizing of ``config`` (an HF ``config.json``) on ``memory`` at TP ``tp``; the
    keyword arguments are the flags a user gave, which SGLang honours the same way."""
    _, default_chunk, small_tp_bs, large_tp_bs = next(tier for tier in MEMORY_TIERS if memory.total_mib < tier[0])
    chunk = default_chunk if chunked_prefill_size is None else chunked_prefill_size
    decode_bs = small_tp_bs if tp < LARGE_TP else large_tp_bs
    if max_running_requests is not None:
        decode_bs = min(decode_bs, max_running_requests)
    prefill_bs = min(chunk, max_total_tokens) if max_total_tokens is not None else chunk
    activation_tokens = max(chunk if chunk > 0 else DEFAULT_MAX_PREFILL_TOKENS, MIN_ACTIVATION_TOKENS)
    reserved = (
        RESERVED_BASE_MIB
        + activation_tokens * ACTIVATION_MIB_PER_TOKEN
        + tp / 8 * PARALLEL_MIB_PER_8_RANKS
        + decode_bs * DECODE_GRAPH_MIB_PER_BS
        + len(prefill_graph_buckets(prefill_bs)) * PREFILL_GRAPH_MIB_PER_BUCKET
    )
    if memory.total_mib > LARGE_DEVICE_MIB:
        reserved = max(reserved, LARGE_DEVICE_MIN_RESERVED_MIB)
    fraction = (
        round((memory.total_mib - reserved) / memory.total_mib, 3)
        if mem_fraction_static is None
        else mem_fraction_static
    )
    free = memory.free_at_load_gib
    weights = ModelSpec.from_hf_config(config).params * _dtype_bytes(config) / tp / BYTES_PER_GIB
    rest_gib = (free - weights) - free * (1 - fraction)
    if rest_gib <= 0:
        raise ValueError(
            f"the weights ({weights:.1f} GiB per rank) leave no KV memory at mem_fraction_static "
            f"{fraction} on this device: raise --tp-size"
        )
    cell = kv_bytes_per_token(config, tp)
    tokens = int(rest_gib * BYTES_PER_GIB) // cell
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    return EngineSizing(
        chunk,
        decode_bs,
        reserved,
        fraction,
        free,
        weights,
        cell,
        tokens,
        _max_running_requests(tokens, int(config["max_position_embeddings"]), max_running_requests),
    )


def _max_running_requests(tokens: int, context_len: int, requested: int | None) -> int:
    if requested is not None:
        return min(requested, tokens // 2)
    estimated = max(
        min(int(tokens / context_len * RUNNING_REQUESTS_PER_CONTEXT), MAX_ESTIMATED_RUNNING), MIN_ESTIMATED_RUNNING
    )
    return min(estimated, tokens // 2)


def _dtype_bytes(config: Mapping[str, Any]) -> int:
    return _DTYPE_BYTES[str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")]
