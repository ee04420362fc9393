"""How an iteration's compute time and memory time combine: ``T = f((1 - s) T_comp, T_mem)``.

Every choice is ``a max(c, m) + b min(c, m) + k``:

- ``sum`` (a=b=1): nothing overlaps, one kernel at a time;
- ``max`` (a=1, b=0): perfect overlap, the paper's idealised ``T_o``;
- ``interference`` (a=1, b=lambda): overlap where the smaller term still costs a fraction lambda,
  the slowdown co-running GEMM and attention kernels show when they contend for SMs and cache;
- ``fitted``: coefficients fitted by least squares to profiled (comp, mem, measured) iterations,
  the paper's "profiled practical" overlap.

For 0 <= b <= a the sum over iterations is at least ``f`` of the summed terms, so ``f`` applied to
a workload's totals is a lower bound on any schedule's time: the practical ``T_o``.

The default is ``interference`` with lambda = the device's measured ``corun_interference``
(`HardwareSpec`): a GEMM co-running with decode attention on two plain CUDA streams -- how stock
SGLang overlaps work -- fits lambda = 0.90 on the H100 (SM partitions measure 0.90 too), so the
shorter side is barely hidden and blending buys at most ~5% per step. The one setting that fits
far less, 0.24, is the bound of each op timed alone on its own SM partition: NanoFlow-class
operator overlap with no contention, named ``nanoflow-bound`` in outputs. ``--interference``
sets lambda explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sgl_blend.core.cost_model import PARTITION_BOUND_INTERFERENCE, TWO_STREAM_INTERFERENCE, HardwareSpec

OVERLAP_NAMES = ("sum", "max", "interference", "fitted")


@dataclass(frozen=True)
class OverlapFunction:
    name: str
    weight_max: float
    weight_min: float
    constant: float = 0.0

    def __call__(self, comp: float, mem: float) -> float:
        return self.weight_max * max(comp, mem) + self.weight_min * min(comp, mem) + self.constant

    def vector(self, comp: np.ndarray, mem: np.ndarray) -> np.ndarray:
        return self.weight_max * np.maximum(comp, mem) + self.weight_min * np.minimum(comp, mem) + self.constant


def fit_overlap(samples: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    """``(a, b, k)`` minimising squared error of ``a max + b min + k`` over (comp, mem, measured)."""
    data = np.asarray(samples, dtype=float)
    design = np.column_stack(
        [np.maximum(data[:, 0], data[:, 1]), np.minimum(data[:, 0], data[:, 1]), np.ones(len(data))]
    )
    coefficients, *_ = np.linalg.lstsq(design, data[:, 2], rcond=None)
    return float(coefficients[0]), float(coefficients[1]), float(coefficients[2])


def interference_label(interference: float) -> str:
    """The name outputs give an interference overlap: the two measured settings by what they
    stand for, any other lambda by its value."""
    if interference == TWO_STREAM_INTERFERENCE:
        return f"two-stream({interference:g})"
    if interference == PARTITION_BOUND_INTERFERENCE:
        return f"nanoflow-bound({interference:g})"
    return f"interference({interference:g})"


def overlap_function(
    name: str, interference: float = TWO_STREAM_INTERFERENCE, fitted: tuple[float, float, float] | None = None
) -> OverlapFunction:
    """The named overlap. ``interference`` defaults to the two-stream figure measured on the
    H100; use `hardware_overlap` to take it from the device profile instead."""
    if name == "sum":
        return OverlapFunction("sum", 1.0, 1.0)
    if name == "max":
        return OverlapFunction("max", 1.0, 0.0)
    if name == "interference":
        return OverlapFunction(interference_label(interference), 1.0, interference)
    if name == "fitted":
        if fitted is None:
            raise ValueError("the fitted overlap needs its (a, b, k) coefficients")
        return OverlapFunction("fitted({:g}, {:g}, {:g})".format(*fitted), *fitted)
    raise ValueError(f"unknown overlap function {name!r}; known: {', '.join(OVERLAP_NAMES)}")


def hardware_overlap(
    hardware: HardwareSpec,
    name: str = "interference",
    interference: float | None = None,
    fitted: tuple[float, float, float] | None = None,
) -> OverlapFunction:
    """The simulator's default: ``interference`` with lambda from the device's measured co-run
    profile (``hardware.corun_interference``) unless ``interference`` overrides it."""
    return overlap_function(name, hardware.corun_interference if interference is None else interference, fitted)
