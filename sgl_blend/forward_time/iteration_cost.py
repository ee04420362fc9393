"""The compute side and the memory side of one forward iteration, on the modelled device.

Both simulators -- the throughput engine (`engine`) and the co-location step model
(`step_time`) -- price an iteration here, so the formula exists once:

- compute side: the linear layers, ``max(tokens * 2P / FLOPs, P * dtype_bytes / bandwidth)`` --
  a GEMM is bound by its FLOPs or by reading its weights, whichever is slower, so a decode-only
  batch of a few hundred requests is weight-bandwidth bound and gains nothing from being small --
  plus prefill attention, ``8 H L`` FLOPs per query-key pair a chunk attends;
- memory side: decode attention, reading every decoding request's KV context.

The overlap function (`overlap`) then combines the two sides into the iteration's time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from sgl_blend.core.cost_model import CostModel

# one context, or a stretch of iterations' contexts at once (the engine's closed-form decode steps)
Context = TypeVar("Context", float, np.ndarray)


@dataclass(frozen=True)
class IterationCost:
    """Per-unit times: a token through the linear layers, one prefill query-key pair, one token
    of decode KV context, and one read of the weights."""

    token_comp: float
    pair_comp: float
    kv_read: float
    weight_read: float

    @classmethod
    def of(cls, cost: CostModel) -> IterationCost:
        model, hardware = cost.model, cost.hardware
        return cls(
            token_comp=2.0 * model.params / hardware.flops,
            pair_comp=8.0 * model.hidden * model.layers / hardware.flops,
            kv_read=model.kv_bytes_per_token / hardware.bandwidth,
            weight_read=model.params * model.dtype_bytes / hardware.bandwidth,
        )

    def linear(self, tokens: float) -> float:
        """Linear layers over ``tokens`` tokens: FLOP time or weight-read time, the larger;
        0 for an empty iteration (no kernel runs)."""
        return max(tokens * self.token_comp, self.weight_read) if tokens > 0 else 0.0

    def compute_side(self, tokens: float, attention_pairs: float) -> float:
        """Compute-side time: linear layers plus prefill attention."""
        return self.linear(tokens) + attention_pairs * self.pair_comp

    def memory_side(self, decode_context: Context) -> Context:
        """Memory-side time: decode attention reading ``decode_context`` KV tokens."""
        return decode_context * self.kv_read
