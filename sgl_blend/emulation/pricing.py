"""What one forward costs on the emulated device: the simulator's own step price, nothing else.

A forward's shape is the cost model's `BatchShape`: each prefill request's extend length with the
cached prefix it attends to, each decode request's context. `StepTime` prices it exactly as the
co-location simulator prices an iteration (`IterationCost`: linear layers at ``max(FLOP time,
weight-read time)`` plus prefill attention on the compute side, decode KV reads on the memory side),
combined by the device's measured overlap (`hardware_overlap`: ``max + lambda min``, lambda 0.90 for
a stock engine's two CUDA streams), on a TP group of ``tp`` devices. There is one model of the
engine; the emulator only feeds it shapes SGLang really ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sgl_blend.core.cost_model import CostModel, ModelSpec, model_spec
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.emulation.devices import EmulatedDevice
from sgl_blend.forward_time.overlap import hardware_overlap
from sgl_blend.forward_time.step_time import StepTime

PREFILL, DECODE, MIXED = "prefill", "decode", "mixed"
KINDS = (PREFILL, DECODE, MIXED)


def batch_shape(extends: Sequence[tuple[int, int]] = (), decode_contexts: Sequence[int] = ()) -> BatchShape:
    """The shape of a forward that extends each request of ``extends`` by ``(extend, prefix)``
    tokens and decodes one token for each context length of ``decode_contexts``."""
    return BatchShape.of(extends, decode_contexts)


@dataclass(frozen=True)
class ForwardPricer:
    """Seconds a forward of a given shape takes on ``tp`` emulated devices running ``model``."""

    step: StepTime
    model: ModelSpec
    hardware_name: str

    @classmethod
    def of(cls, device: EmulatedDevice, model: str, tp: int) -> ForwardPricer:
        """``model`` is a cost-model name (``llama-3.1-8b``) or an HF model directory."""
        spec = model_spec(model)
        hardware = device.hardware.scaled(tp)
        return cls(StepTime.of(CostModel(spec, hardware), hardware_overlap(hardware)), spec, hardware.name)

    def seconds(self, shape: BatchShape) -> float:
        return self.step.seconds(shape)
