"""Adaptive batch size (BROS §IV-B), after TCP's congestion window.

It starts at a conservative base, doubles after each iteration in which real-time requests put
no pressure on the time budget, and falls back to the base on a violation (a predicted batch
that would overrun the most urgent residual, or a real-time request already past its deadline).
It never exceeds what the engine can run at once.

Only the time budget holds it back, as in the paper (§IV-B: it doubles unless Alg. 1 stopped at
lines 11-12). A batch the size itself or the KV pool filled grows: holding the size there, with
more RT requests queued than it admits, kept BROS at the base while new RT prompts waited
seconds behind RT decodes on the emulated H100 (docs/colocation-history.md, "BROS at its own SLO").
"""

from __future__ import annotations

from enum import Enum

BASE_BATCH_SIZE = 128


class Pressure(Enum):
    NONE = "none"  # the time budget did not stop real-time packing: grow
    VIOLATION = "violation"  # stopped by the time budget, or a request is late: reset


class AdaptiveBatchSize:
    def __init__(self, cap: int, base: int = BASE_BATCH_SIZE) -> None:
        if cap < 1 or base < 1:
            raise ValueError(f"batch sizes must be positive, got base {base}, cap {cap}")
        self.cap = cap
        self.base = min(base, cap)
        self.current = self.base

    def update(self, pressure: Pressure) -> int:
        if pressure is Pressure.VIOLATION:
            self.current = self.base
        elif pressure is Pressure.NONE:
            self.current = min(self.current * 2, self.cap)
        return self.current
