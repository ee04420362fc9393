"""GEMM over token counts: the compute-bound half of a transformer step.

A batch of ``tokens`` rows through a ``hidden x ffn`` projection is what every linear layer does;
its achievable FLOP/s (not the datasheet peak) is the compute rate the cost model should use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_blend.kernels.timing import median_seconds


@dataclass
class GemmResult:
    tokens: int
    hidden: int
    ffn: int
    seconds: float

    @property
    def flops(self) -> float:
        return 2.0 * self.tokens * self.hidden * self.ffn

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds


def measure_gemm(tokens: int, hidden: int, ffn: int, device: torch.device, dtype: torch.dtype) -> GemmResult:
    activations = torch.randn(tokens, hidden, device=device, dtype=dtype)
    weight = torch.randn(hidden, ffn, device=device, dtype=dtype)
    seconds = median_seconds(lambda: torch.matmul(activations, weight), device)
    return GemmResult(tokens, hidden, ffn, seconds)
