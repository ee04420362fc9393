"""BlendServe's cost model (paper §4.1): how much compute and memory traffic a request costs.

A request with prompt length p and output length d costs
``Comp = 2 (p + d) P + 4 p^2 H L`` FLOPs (the quadratic attention term is kept; the paper drops
it) and ``Mem = (p d + d^2 / 2) H_kv L 2 b`` bytes of KV reads during decoding. Dividing by the
device's FLOP/s and bandwidth gives times, and their ratio is the request's compute density:
above 1 a request is compute-bound, below 1 memory-bound. A set of requests that share prompt
prefixes computes each shared token once: its density is its compute less what those tokens save
(`SharingPrice`), over its memory time (`shared_density`). Only ratios matter to the scheduler,
so the hardware spec needs no more than peak FLOP/s, bandwidth and KV memory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

GIB = 1024**3
# SGLang's admission reserves decode room for every running request (``schedule_policy.py``):
# ``min(max_new_tokens - decoded, CLIP_MAX_NEW_TOKENS)`` tokens, times the new-token ratio unless
# the request is ``ignore_eos``. The ratio starts at 0.7 after a retraction and decays to 0.1 over
# 600 decode steps, where it sits while nothing is retracted.
CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY_STEPS = 600
# How much of the shorter of a GEMM and a decode attention co-running still costs
# (``T = max + lambda * min``), fitted on a GEMM/attention grid by `bench.device_calibration`
# (``bench/results/calibration_h100.json``). Two plain CUDA streams, which is how stock SGLang runs
# work side by side, measure 0.90 on the H100 (SM-partitioned green contexts also measure 0.90);
# only the bound of each op timed alone on its SM partition -- NanoFlow-class overlap with no
# contention -- fits 0.24. A device without its own calibration takes the two-stream figure.
TWO_STREAM_INTERFERENCE = 0.90
PARTITION_BOUND_INTERFERENCE = 0.24
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as cost goes."""

    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for one token across all layers."""
        return 2 * self.layers * self.kv_dim * self.dtype_bytes

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str = "model") -> ModelSpec:
        """Llama, Qwen2 and Mistral configs (and any config with the same field names)."""
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        ffn = int(config.get("intermediate_size") or 4 * hidden)
        vocab = int(config.get("vocab_size") or 32000)
        attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
        gated = 3 if config.get("hidden_act", "silu") in ("silu", "swiglu", "gelu_pytorch_tanh") else 2
        embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
        params = layers * (attention + gated * hidden * ffn) + embeddings
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        return cls(name, float(params), layers, hidden, kv_heads, head_dim, _DTYPE_BYTES.get(dtype, 2))

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelSpec:
        path = Path(path)
        return cls.from_hf_config(json.loads((path / "config.json").read_text()), name=path.name)


BUILTIN_MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", 8.03e9, 32, 4096, 8, 128),
    "llama-3.1-70b": ModelSpec("llama-3.1-70b", 70.6e9, 80, 8192, 8, 128),
    "qwen2-7b": ModelSpec("qwen2-7b", 7.6e9, 28, 3584, 4, 128),
}


def model_spec(name_or_path: str) -> ModelSpec:
    """A built-in model by name, or the spec read from an HF model directory."""
    if name_or_path in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_path]
    return ModelSpec.from_hf_dir(name_or_path)


@dataclass(frozen=True)
class HardwareSpec:
    """Achievable throughput of one device (or of a TP group once `scaled`), and the measured
    co-run interference of its compute and memory kernels (see `TWO_STREAM_INTERFERENCE`): at
    1.0 nothing overlaps, and blending compute- with memory-heavy work buys nothing."""

    name: str
    flops: float
    bandwidth: float
    kv_memory_bytes: float
    corun_interference: float = TWO_STREAM_INTERFERENCE

    @property
    def blending_pays(self) -> bool:
        """Whether overlapping compute with memory can shorten a step at all on this device."""
        return self.corun_interference < 1.0

    def scaled(self, tp: int) -> HardwareSpec:
        """A TP group of ``tp`` devices: compute, bandwidth and KV memory all scale with it."""
        if tp == 1:
            return self
        return replace(
            self,
            name=f"{self.name}x{tp}",
            flops=self.flops * tp,
            bandwidth=self.bandwidth * tp,
            kv_memory_bytes=self.kv_memory_bytes * tp,
        )

    def to_json(self, path: Path, extra: Mapping[str, Any] | None = None) -> None:
        path.write_text(json.dumps({**asdict(self), **(extra or {})}, indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> HardwareSpec:
        data = json.loads(Path(path).read_text())
        return cls(
            data["name"],
            float(data["flops"]),
            float(data["bandwidth"]),
            float(data["kv_memory_bytes"]),
            float(data.get("corun_interference", TWO_STREAM_INTERFERENCE)),
        )

    @classmethod
    def resolve(cls, name_or_path: str) -> HardwareSpec:
        """A built-in device (optionally ``NAMExTP``, e.g. ``a100-80gx8``) or a profile JSON."""
        match = re.fullmatch(r"(.+?)(?:x(\d+))?", name_or_path)
        if match is None:  # only the empty name fails to match
            raise ValueError(f"unknown hardware {name_or_path!r}: not one of {', '.join(BUILTIN_HARDWARE)} nor a file")
        base, tp = match.groups()
        if base in BUILTIN_HARDWARE:
            return BUILTIN_HARDWARE[base].scaled(int(tp) if tp else 1)
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"unknown hardware {name_or_path!r}: not one of {', '.join(BUILTIN_HARDWARE)} nor a file")
        return cls.from_json(path)


BUILTIN_HARDWARE: dict[str, HardwareSpec] = {
    # Dense bf16 peak and HBM bandwidth from the vendor sheets; KV memory is what is left of
    # 80/141 GB after Llama-3.1-8B's 16 GB of weights and activations, as the paper runs it.
    "a100-80g": HardwareSpec("a100-80g", 312e12, 2.039e12, 60 * GIB),
    "h100-sxm": HardwareSpec("h100-sxm", 989e12, 3.35e12, 60 * GIB),
    "h200": HardwareSpec("h200", 989e12, 4.8e12, 120 * GIB),
    # This 2-core CPU as `python -m bench.device_calibration --device cpu --quick` measured it
    # (bench/results/calibration_cpu.json): a GEMM and a decode attention in two threads take
    # 1.36x the longer one plus the shorter one, so nothing overlaps; KV is SGLang's CPU default pool.
    "cpu": HardwareSpec("cpu", 0.1e12, 9e9, 65536 * 2 * 2 * 64 * 2, corun_interference=1.36),
}


class CostModel:
    """Per-request compute and memory time for one model on one device."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec) -> None:
        self.model = model
        self.hardware = hardware
        self._flops_per_token = 2.0 * model.params
        self._attn_coeff = 4.0 * model.hidden * model.layers
        self._kv_bytes = model.kv_dim * model.layers * 2 * model.dtype_bytes

    def comp_time(self, prompt: int, output: int) -> float:
        return ((prompt + output) * self._flops_per_token + self._attn_coeff * prompt * prompt) / self.hardware.flops

    def sharing_price(self) -> SharingPrice:
        """What a cached prompt token saves on this model and device (see `SharingPrice`)."""
        return SharingPrice(self._flops_per_token / self.hardware.flops, 2.0 * self._attn_coeff / self.hardware.flops)

    def mem_time(self, prompt: int, output: int) -> float:
        return (prompt * output + output * output / 2.0) * self._kv_bytes / self.hardware.bandwidth

    def density(self, prompt: int, output: int) -> float:
        mem = self.mem_time(prompt, output)
        return self.comp_time(prompt, output) / mem if mem > 0 else float("inf")

    def kv_capacity_tokens(self) -> int:
        return int(self.hardware.kv_memory_bytes // self.model.kv_bytes_per_token)

    def kv_footprint(self, prompt: int, output: int) -> float:
        """Average KV tokens a request holds over its life: the paper's ``p + d/2``."""
        return prompt + output / 2.0

    def kv_commitment(self, prompt: int, output: int, max_new_tokens: int, exact: bool) -> float:
        """Average KV tokens SGLang's admission counts against a running request: what it holds
        (``p + d/2``) plus the decode room reserved for it (see `decode_reserve`)."""
        return self.kv_footprint(prompt, output) + decode_reserve(output, max_new_tokens, exact)


def reserve_at(decoded, max_new_tokens, exact):
    """The room SGLang's admission reserves for a running request that has decoded ``decoded``
    tokens: ``min(max_new_tokens - decoded, CLIP)``, times the steady new-token ratio unless the
    request is ``ignore_eos``. Takes numbers or numpy arrays alike."""
    ratio = np.where(exact, 1.0, MIN_NEW_TOKEN_RATIO)
    return ratio * np.minimum(np.maximum(np.subtract(max_new_tokens, decoded), 0), CLIP_MAX_NEW_TOKENS)


def decode_reserve(output: int, max_new_tokens: int, exact: bool) -> float:
    """Mean over a request's ``output`` decode steps of the room SGLang reserves for it,
    ``min(max_new_tokens - k, CLIP) * ratio`` at step k, at the steady ratio.

    It matters for long ``ignore_eos`` outputs: a 16K-token video request reserves close to
    4096 tokens for most of its life, so a memory share counted in ``p + d/2`` alone would
    promise the engine 40% more requests than its admission check lets in.
    """
    if output <= 0:
        return 0.0
    ratio = 1.0 if exact else MIN_NEW_TOKEN_RATIO
    start = max(max_new_tokens, output)
    # sum over k in [0, output) of min(start - k, CLIP): the clipped part, then the tail below CLIP
    clipped = min(output, max(start - CLIP_MAX_NEW_TOKENS, 0))
    tail_first, tail_last = start - clipped, start - output + 1
    tail = (tail_first + tail_last) * (tail_first - tail_last + 1) / 2.0 if output > clipped else 0.0
    return ratio * (clipped * CLIP_MAX_NEW_TOKENS + tail) / output


@dataclass(frozen=True)
class SharingPrice:
    """Compute seconds a prompt token found in the prefix cache saves: ``token`` for its pass
    through the linear layers (``2 P / FLOPs``) and ``pair`` for each query-key pair of its own
    causal attention row (``8 H L / FLOPs``; `CostModel.comp_time`'s ``4 p^2 H L`` is ``p^2 / 2``
    such pairs). A request that reuses a cached prefix of ``k`` tokens computes neither their
    ``k`` linear passes nor their ``k^2 / 2`` pairs; its remaining tokens still attend to them.

    This is what BlendServe's densities discount for sharing, instead of the paper's ``(1 - s)``
    of all compute: sharing removes prompt tokens from the prefill and nothing else, so a set whose
    compute is mostly decoding keeps it, and a set of few-shot prompts sheds most of its compute.
    For a set whose compute is all prefill the two coincide."""

    token: float
    pair: float

    def saving(self, tokens: float, pairs: float) -> float:
        """Seconds saved by ``tokens`` cached prompt tokens whose own rows hold ``pairs`` pairs."""
        return tokens * self.token + pairs * self.pair

    def prefix_saving(self, length: int) -> float:
        """Seconds a request saves by finding its first ``length`` prompt tokens cached."""
        return self.saving(length, length * length / 2.0)


def optimal_time(t_comp: float, t_mem: float, sharing: float) -> float:
    """``T_o = max((1 - s) T_comp, T_mem)``: perfect overlap at sharing ratio s."""
    return max((1.0 - sharing) * t_comp, t_mem)


def shared_density(t_comp: float, t_mem: float, saved: float) -> float:
    """``rho(R)`` of a request set: its compute less the ``saved`` seconds its shared prompt
    tokens do not recompute (`SharingPrice`), over its memory time."""
    return max(t_comp - saved, 0.0) / t_mem if t_mem > 0 else float("inf")


def memory_partition(total: float, rho_root: float, rho_left: float, rho_right: float) -> tuple[float, float]:
    """Split memory so the blended density of both sides equals the root's (Alg. 3, step 1).

    ``M_L rho_L + M_R rho_R = M rho_root`` with ``M_L + M_R = M``. The degenerate cases: equal
    side densities give an even split; a root density outside [rho_R, rho_L] gives everything to
    the nearer side.
    """
    if rho_left - rho_right <= 1e-12 * max(abs(rho_left), 1.0):
        return total / 2.0, total / 2.0
    fraction = (rho_root - rho_right) / (rho_left - rho_right)
    fraction = min(1.0, max(0.0, fraction))
    return total * fraction, total * (1.0 - fraction)
