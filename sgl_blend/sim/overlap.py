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

The default is ``interference`` with lambda = 0.15: BlendServe runs on NanoFlow-style
operator-level overlap, where GEMM and decode attention run at once on partitioned SMs and the
shorter of the two is mostly hidden. A GEMM/attention pair profiled on an H100 on SM partitions
(``bench/device_calibration.py``) fits ``b`` = 0.16 for that bound; the same pair launched on two
plain streams hides almost nothing (lambda = 0.90), which is why the overlap, and so the whole
benefit of blending, depends on the engine's kernels. ``--interference`` sets lambda.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

DEFAULT_INTERFERENCE = 0.15
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
    design = np.column_stack([np.maximum(data[:, 0], data[:, 1]), np.minimum(data[:, 0], data[:, 1]),
                              np.ones(len(data))])
    coefficients, *_ = np.linalg.lstsq(design, data[:, 2], rcond=None)
    return float(coefficients[0]), float(coefficients[1]), float(coefficients[2])


def overlap_function(name: str, interference: float = DEFAULT_INTERFERENCE,
                     fitted: tuple[float, float, float] | None = None) -> OverlapFunction:
    if name == "sum":
        return OverlapFunction("sum", 1.0, 1.0)
    if name == "max":
        return OverlapFunction("max", 1.0, 0.0)
    if name == "interference":
        return OverlapFunction(f"interference({interference:g})", 1.0, interference)
    if name == "fitted":
        if fitted is None:
            raise ValueError("the fitted overlap needs its (a, b, k) coefficients")
        return OverlapFunction("fitted({:g}, {:g}, {:g})".format(*fitted), *fitted)
    raise ValueError(f"unknown overlap function {name!r}; known: {', '.join(OVERLAP_NAMES)}")
