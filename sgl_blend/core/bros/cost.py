"""BROS's iteration cost (§IV-A): ``max(t_exec, t_swap)``.

``t_exec`` is the per-phase form ``a0 L_n + a1 L_n L_a + b`` that `latency_model` already fits
(form ``bros``, prefill and decode summed). ``t_swap`` is a linear model of host-to-device copy
time fitted on measured copies (``kernels/transfer.py``): the KV tokens a batch must bring back
from host memory. Swaps run asynchronously beside the forward pass, so they only cost time when
they are the longer of the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sgl_blend.core.latency_model import BatchShape, LatencyModel


@dataclass(frozen=True)
class SwapModel:
    """``seconds = setup_s + tokens · bytes_per_token / bytes_per_s`` for host-to-device copies."""

    bytes_per_token: float
    bytes_per_s: float
    setup_s: float = 0.0

    def __post_init__(self) -> None:
        if self.bytes_per_token <= 0 or self.bytes_per_s <= 0 or self.setup_s < 0:
            raise ValueError("a swap model needs positive bytes per token and bandwidth, and a non-negative setup")

    def seconds(self, tokens: int) -> float:
        return 0.0 if tokens <= 0 else self.setup_s + tokens * self.bytes_per_token / self.bytes_per_s

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, float]], bytes_per_token: float) -> SwapModel:
        """Least squares on measured ``(bytes, seconds)`` copies; a negative intercept (noise on
        small copies) is clipped to zero and the slope refitted through the origin."""
        if len(samples) < 2:
            raise ValueError("fitting a swap model needs at least two timed copies")
        sizes = np.asarray([size for size, _ in samples], dtype=float)
        times = np.asarray([seconds for _, seconds in samples], dtype=float)
        slope, intercept = np.polyfit(sizes, times, 1)
        if intercept < 0 or slope <= 0:
            slope, intercept = float(np.dot(sizes, times) / np.dot(sizes, sizes)), 0.0
        return cls(bytes_per_token, 1.0 / float(slope), float(intercept))


@dataclass(frozen=True)
class IterationCost:
    """The cost model ``C`` of Alg. 1: predicted seconds of one iteration."""

    model: LatencyModel
    swap: SwapModel | None = None

    def predict(self, shape: BatchShape, swap_tokens: int = 0) -> float:
        execute = self.model.predict(shape)
        if self.swap is None:
            return execute
        return max(execute, self.swap.seconds(swap_tokens))
