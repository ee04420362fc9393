"""How long the plugin's own code holds SGLang's scheduler loop, per iteration.

Every hook adds the time it spent outside SGLang's code (an AROUND hook: before and after the
original, not the original itself); the sum since the previous forward's launch is that
iteration's plugin time. `/server_info` reports its percentiles over the last iterations, beside
the host gaps between forwards the iteration records carry, so a benchmark can show what the
plugin costs where online requests wait.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

KEPT_ITERATIONS = 4096


class PluginTime:
    def __init__(self) -> None:
        self._spent = 0.0
        self._started: float | None = None
        self.per_iteration: deque[float] = deque(maxlen=KEPT_ITERATIONS)

    def __enter__(self) -> PluginTime:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started is not None:
            self._spent += time.perf_counter() - self._started
            self._started = None

    def iteration_done(self) -> float:
        """A forward is launched: what the plugin spent since the last one is this iteration's."""
        spent, self._spent = self._spent, 0.0
        self.per_iteration.append(spent)
        return spent

    def snapshot(self) -> dict[str, Any]:
        times = sorted(self.per_iteration)
        if not times:
            return {"iterations": 0}

        def at(quantile: float) -> float:
            return round(times[min(len(times) - 1, int(quantile * len(times)))] * 1000, 4)

        return {"iterations": len(times), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)}
