"""The emulated device's clock: priced forwards, plus the wall time the engine had nothing to run.

An emulated job's duration is not this machine's wall time (the CPU spends its own time on every
forward): it is the device time of its forwards plus the time the device would have idled, which
is the wall time during which the scheduler found no batch to run -- waiting for requests to
arrive is as long on the emulated device as here. The scheduler is single-threaded and
``/server_info`` is answered in its loop, so the clock needs no lock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sgl_blend.core.latency_model import BatchShape
from sgl_blend.emulation.pricing import KINDS

# How many of the latest forwards `state` lists with their shapes (what a test or a bench
# re-prices); the totals cover every forward.
RECENT_FORWARDS = 1024


@dataclass
class KindTotals:
    """One batch kind's forwards: count, priced seconds, tokens, and measured seconds where the
    real forward ran."""

    forwards: int = 0
    device_seconds: float = 0.0
    tokens: int = 0
    measured_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "forwards": self.forwards,
            "device_seconds": self.device_seconds,
            "tokens": self.tokens,
            "measured_seconds": self.measured_seconds,
        }


class DeviceClock:
    def __init__(self, now: Callable[[], float] = time.monotonic, recent: int = RECENT_FORWARDS) -> None:
        self._now = now
        self.started = now()
        self.device_seconds = 0.0
        self.forwards = 0
        self.idle_wall_seconds = 0.0
        self._idle_since: float | None = None
        self.by_kind = {kind: KindTotals() for kind in KINDS}
        self.recent: deque[dict[str, Any]] = deque(maxlen=recent)

    def idle(self) -> None:
        """The scheduler found nothing to run: idle time runs from now until the next forward."""
        if self._idle_since is None:
            self._idle_since = self._now()

    def busy(self) -> None:
        """A forward starts: any idle interval ends now."""
        if self._idle_since is not None:
            self.idle_wall_seconds += self._now() - self._idle_since
            self._idle_since = None

    def forward(self, kind: str, shape: BatchShape, seconds: float, measured_s: float | None = None) -> None:
        """A forward of ``shape`` ran, priced at ``seconds`` (``measured_s``: its real time, when it
        really ran)."""
        self.busy()
        self.device_seconds += seconds
        self.forwards += 1
        totals = self.by_kind[kind]
        totals.forwards += 1
        totals.device_seconds += seconds
        totals.tokens += shape.prefill_tokens + shape.decode_reqs
        totals.measured_seconds += measured_s or 0.0
        self.recent.append({"kind": kind, "shape": shape.to_dict(), "seconds": seconds, "measured_seconds": measured_s})

    def state(self) -> dict[str, Any]:
        """Totals since start; an idle interval under way counts up to now (and how much of it is
        under way: a job that ended before it began did not wait through it)."""
        now = self._now()
        under_way = now - self._idle_since if self._idle_since is not None else 0.0
        return {
            "device_seconds": self.device_seconds,
            "forwards": self.forwards,
            "idle_wall_seconds": self.idle_wall_seconds + under_way,
            "idle_under_way_seconds": under_way,
            "wall_seconds": now - self.started,
            "by_kind": {kind: totals.to_dict() for kind, totals in self.by_kind.items()},
            "recent": list(self.recent),
            "recent_dropped": self.forwards - len(self.recent),
        }
