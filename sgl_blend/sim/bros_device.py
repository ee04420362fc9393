"""The modelled device the BROS simulation runs on, and its latency profile.

Ground truth is a roofline: an iteration takes ``max(FLOPs / peak, bytes / bandwidth)`` plus a
fixed launch overhead, where bytes are the weights once plus every KV token read or written.
The scheduler never sees it: like the real server, it only gets the ``bros`` form fitted on a
profile of the device (the paper's exponential grid of batch shapes), so its predictions carry
the fit's error into the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from sgl_blend.core.bros.cost import IterationCost, SwapModel
from sgl_blend.core.cost_model import HardwareSpec, ModelSpec
from sgl_blend.core.latency_model import BatchShape, LinearLatencyModel, fit_linear

LAUNCH_OVERHEAD_S = 0.002
# Pinned host-to-device copies timed by kernels/transfer.py on the lab's H100 (bytes, seconds):
# BROS's swap model is fitted on these wherever the modelled device is an H100.
H100_H2D_SAMPLES = ((1048576, 3.2017e-05), (16777216, 3.18247e-04), (67108864, 1.239361e-03), (268435456, 5.097975e-03))


@dataclass(frozen=True)
class RooflineDevice:
    model: ModelSpec
    hardware: HardwareSpec
    swap: SwapModel
    overhead_s: float = LAUNCH_OVERHEAD_S

    def exec_s(self, shape: BatchShape) -> float:
        if shape.is_empty():
            return 0.0
        model = self.model
        attention = 4.0 * model.hidden * model.layers * (shape.prefill_attention + shape.decode_context)
        flops = 2.0 * model.params * (shape.prefill_tokens + shape.decode_reqs) + attention
        kv_tokens = shape.prefill_tokens + shape.decode_context
        traffic = model.params * model.dtype_bytes + kv_tokens * model.kv_bytes_per_token
        return max(flops / self.hardware.flops, traffic / self.hardware.bandwidth) + self.overhead_s

    def iteration_s(self, shape: BatchShape, swap_tokens: int) -> float:
        return max(self.exec_s(shape), self.swap.seconds(swap_tokens))

    def profile(self) -> tuple[list[BatchShape], list[float]]:
        """Prefill-only, decode-only and mixed batches on exponential grids, timed."""
        shapes: list[BatchShape] = []
        for tokens in (2**k for k in range(4, 15)):
            for requests in (1, 4, 16):
                if tokens >= requests:
                    shape = BatchShape()
                    for _ in range(requests):
                        shape = shape.with_prefill(tokens // requests)
                    shapes.append(shape)
        for requests in (2**k for k in range(0, 10)):
            for context in (2**k for k in range(6, 13)):
                decode = BatchShape()
                for _ in range(requests):
                    decode = decode.with_decode(context)
                shapes.append(decode)
                shapes.append(decode.with_prefill(512))
        return shapes, [self.exec_s(shape) for shape in shapes]

    def fitted_cost(self) -> IterationCost:
        shapes, times = self.profile()
        model: LinearLatencyModel = fit_linear("bros", shapes, times)
        return IterationCost(model, self.swap)
