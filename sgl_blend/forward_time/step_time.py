"""What one forward batch of a given composition really takes on the modelled device.

Co-location is about latency, and a batch of a few decodes is bound by reading the weights:
prefill tokens or more decodes ride along almost free until the GEMMs' FLOPs catch up with that
read. That slack is what HyGen and Echo fill with offline work. The iteration is priced by
`IterationCost`, the same helper the throughput engine uses (linear layers ``max(FLOP time,
weight-read time)`` plus prefill attention on the compute side, decode KV reads on the memory
side), and the two sides combine through the simulator's overlap function. A seeded log-normal
jitter stands for the run-to-run noise a real engine shows, so a latency model fitted on profiled
batches (`profile`) has a realistic error rather than none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sgl_blend.core.cost_model import CostModel
from sgl_blend.core.latency_model import BatchShape, FitReport, fit_forms
from sgl_blend.forward_time.iteration_cost import IterationCost
from sgl_blend.forward_time.overlap import OverlapFunction

DEFAULT_JITTER = 0.02


@dataclass(frozen=True)
class StepTime:
    cost: IterationCost
    overlap: OverlapFunction

    @classmethod
    def of(cls, cost: CostModel, overlap: OverlapFunction) -> StepTime:
        return cls(IterationCost.of(cost), overlap)

    def sides(self, shape: BatchShape) -> tuple[float, float]:
        """``shape``'s compute side and memory side, before the overlap combines them."""
        comp = self.cost.compute_side(shape.prefill_tokens + shape.decode_reqs, shape.causal_pairs)
        return comp, self.cost.memory_side(shape.decode_context)

    def seconds(self, shape: BatchShape) -> float:
        """Noise-free time of ``shape``; 0 for an empty batch."""
        if shape.is_empty():
            return 0.0
        return self.overlap(*self.sides(shape))


class IterationClock(Protocol):
    """What a simulated engine asks of its clock: how long an iteration of ``shape`` lasts."""

    def measure(self, shape: BatchShape) -> float: ...


class NoisyClock:
    """`StepTime` with seeded multiplicative jitter: the engine's measured iteration times."""

    def __init__(self, step: StepTime, jitter: float = DEFAULT_JITTER, seed: int = 0) -> None:
        self.step = step
        self.jitter = jitter
        self._rng = np.random.default_rng(seed)

    def measure(self, shape: BatchShape) -> float:
        base = self.step.seconds(shape)
        return base * float(self._rng.lognormal(0.0, self.jitter)) if self.jitter > 0 else base


def profile_shapes(
    count: int, seed: int = 0, max_prefill: int = 2048, max_decodes: int = 256, max_context: int = 8192
) -> list[BatchShape]:
    """Random batch compositions spanning what a co-located engine runs: decode-only batches,
    prefill-only ones and mixtures, as `sgl-blend profile --latency` sweeps the real engine."""
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(count):
        shape = BatchShape()
        kind = rng.integers(3)
        if kind != 1:
            for _ in range(int(rng.integers(1, 4))):
                shape = shape.with_prefill(
                    int(rng.integers(1, max_prefill // 2 + 1)), int(rng.integers(0, max_context // 4))
                )
        if kind != 0:
            decodes = int(rng.integers(1, max_decodes + 1))
            contexts = rng.integers(16, max_context, decodes)
            shape = BatchShape(
                shape.prefill_tokens,
                shape.prefill_reqs,
                shape.prefill_attention,
                decodes,
                int(contexts.sum()),
                int(contexts.max()),
                shape.prefill_chunks,
            )
        shapes.append(shape)
    return shapes


def fit_latency(clock: NoisyClock, count: int = 400, seed: int = 0) -> FitReport:
    """Profile ``count`` random batches on ``clock`` and fit every latency-model form, the way
    `sgl-blend profile --latency` does on the real engine (held-out MAPE included)."""
    shapes = profile_shapes(count, seed)
    return fit_forms(shapes, [clock.measure(shape) for shape in shapes], seed=seed)
