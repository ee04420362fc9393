"""The emulated GPU in real time: each skipped forward lasts its priced time on the wall clock.

Co-location is judged on latency, and latency needs the forward to take time: an online request
that arrives while an offline prefill runs waits for it, and tokens reach the client when the
device produces them. So a forward priced at ``t`` seconds returns ``factor · t`` seconds after
the device began it. ``factor`` is the stated slow-down: when this host cannot schedule a batch
inside the forward before it (two shared cores, a Python scheduler), every duration is stretched
by the same factor and every latency a client measures is device time ``wall / factor``.

When does the device begin a forward? A GPU engine keeps its device busy back to back: SGLang's
overlap scheduler prepares the next batch while the current one runs, so the host's scheduling
and result processing between forwards cost the device nothing as long as they are shorter than
the forward. The pacer models exactly that: a forward that follows another without the engine
going idle begins when the previous one ended; after an idle spell (`idle`) it begins when it is
called. When the host was slower than the device -- the call comes after the forward should
already have ended -- the forward returns at once and the lateness is counted (``behind_*``): it is
the measure of whether ``factor`` is large enough for this host. SGLang's own overlap
scheduler stays as a stock server has it (on), so job times are a stock engine's; latencies are
not: with it on, SGLang processes a batch's result only after the next forward's sleep, so every token
reaches the client one forward late, and a run judged on latency passes
``--disable-overlap-schedule``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class RealTimePacer:
    """``factor`` wall seconds per device second; ``now`` and ``sleep`` are injectable for tests."""

    factor: float
    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"the real-time factor must be positive, got {self.factor}")
        self._device_free_at: float | None = None
        self.forwards = 0
        self.slept_s = 0.0
        self.host_gap_s = 0.0
        self.behind_forwards = 0
        self.behind_s = 0.0
        self.max_behind_s = 0.0

    def idle(self) -> None:
        """The engine found nothing to run: the next forward begins when it is called."""
        self._device_free_at = None

    def run(self, device_seconds: float) -> None:
        """Hold the caller until the forward priced at ``device_seconds`` has ended on the wall clock."""
        called = self.now()
        began = called if self._device_free_at is None else self._device_free_at
        if self._device_free_at is not None:
            self.host_gap_s += called - self._device_free_at
        ends = began + self.factor * device_seconds
        self.forwards += 1
        if ends >= called:
            self.sleep(ends - called)
            self.slept_s += ends - called
            self._device_free_at = ends
            return
        late = called - ends
        self.behind_forwards += 1
        self.behind_s += late
        self.max_behind_s = max(self.max_behind_s, late)
        self._device_free_at = called

    def state(self) -> dict[str, Any]:
        """``host_gap_s``: wall time between back-to-back forwards (the host's scheduling work);
        ``behind_s``: how much later than the device the host delivered its batches, in total."""
        return {
            "factor": self.factor,
            "forwards": self.forwards,
            "slept_s": self.slept_s,
            "host_gap_s": self.host_gap_s,
            "behind_forwards": self.behind_forwards,
            "behind_s": self.behind_s,
            "max_behind_s": self.max_behind_s,
        }
