"""Decode attention over KV lengths: the memory-bound half of a transformer step.

One new query token per request attends over its whole KV cache, so the time is the time to
stream K and V from memory; bytes moved over seconds is the bandwidth the cost model should use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sgl_blend.kernels.timing import median_seconds


@dataclass
class AttentionResult:
    batch: int
    kv_len: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    seconds: float

    @property
    def bytes(self) -> float:
        return 2.0 * self.batch * self.kv_len * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds


def measure_decode_attention(
    batch: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, device: torch.device, dtype: torch.dtype
) -> AttentionResult:
    query = torch.randn(batch, heads, 1, head_dim, device=device, dtype=dtype)
    keys = torch.randn(batch, kv_heads, kv_len, head_dim, device=device, dtype=dtype)
    values = torch.randn(batch, kv_heads, kv_len, head_dim, device=device, dtype=dtype)

    def attend() -> torch.Tensor:
        return F.scaled_dot_product_attention(query, keys, values, enable_gqa=heads != kv_heads)

    seconds = median_seconds(attend, device)
    return AttentionResult(batch, kv_len, kv_heads, head_dim, query.element_size(), seconds)
