"""How an iteration's compute time and memory time combine: ``T = f(T_comp, T_mem)``.

``sum`` is an engine that overlaps nothing (SGLang or vLLM running one kernel at a time);
``max`` is perfect overlap (the bound NanoFlow-style operator overlapping approaches);
``interference`` is max plus a fraction of the smaller term, the contention that co-running
GEMM and attention kernels actually show; ``fitted`` takes ``a max + b min + c`` from a profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_INTERFERENCE = 0.15


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


def overlap_function(name: str, interference: float = DEFAULT_INTERFERENCE,
                     fitted: tuple[float, float, float] | None = None) -> OverlapFunction:
    if name == "sum":
        return OverlapFunction("sum", 1.0, 1.0)
    if name == "max":
        return OverlapFunction("max", 1.0, 0.0)
    if name == "interference":
        return OverlapFunction(f"interference({interference})", 1.0, interference)
    if name == "fitted":
        if fitted is None:
            raise ValueError("the fitted overlap needs its (a, b, c) coefficients")
        return OverlapFunction("fitted", *fitted)
    raise ValueError(f"unknown overlap function {name!r}; known: sum, max, interference, fitted")
