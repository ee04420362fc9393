"""The host in the simulator: the scheduler's time between forwards, measured on an emulated run.

The simulator prices an iteration at its forward alone, which is a GPU server's engine when its
host keeps up (SGLang overlaps scheduling with the forward). The emulated engine on a small CPU
host does not keep up once offline work runs: its real-time pacer (`emulation.realtime`) starts a
forward when the device is free or when the host hands it the batch, whichever is later, so an
iteration lasts ``max(price, host gap)``. To check the simulator against that engine, and to
predict what a host like it gives, the simulator can take the same rule with the gaps the
emulated engine measured.

A gap (`core.host_gap`) is the time between a forward's end and the next launch, spent on result
processing, streaming and scheduling on the host's shared cores. It grows with the requests a
batch carries, so gaps are kept by the batch's request count, and a simulated iteration draws
one measured from batches of its size.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from sgl_blend.core.host_gap import batch_requests, gap_after
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.forward_time.step_time import IterationClock

# Upper bounds of the request-count classes gaps are kept in (the last class is open).
REQUEST_CLASSES = (8, 16, 32, 64, 128, 256)
# A class measured from fewer gaps than this draws from the nearest class measured from at least
# as many. One or two gaps are no distribution: a HyGen replay at 30% load on the tuning seed
# (`bench.front_end --requests 300`, 26 s) measured batches under 32 requests twice, 9-10 ms
# against the 5 ms median of the 2,748 gaps of the next class, and HyGen's budget, calibrated on
# those draws, held the simulated engine to 1,979 offline tok/s on evaluation seed 1 where the
# emulated one decoded about 4,190; with the sparse classes pooled it simulates 4,148, the same
# for any bound from 10 to 200 (docs/colocation-history.md, the simulator check).
MIN_CLASS_GAPS = 50


@dataclass(frozen=True)
class HostGaps:
    """Measured host gaps (seconds), one sorted tuple per request-count class of
    `REQUEST_CLASSES`; a class with fewer than `MIN_CLASS_GAPS` borrows the nearest one with as
    many (or, when none has, the nearest measured one)."""

    by_class: tuple[tuple[float, ...], ...]

    @classmethod
    def measure(
        cls, records: Iterable[dict[str, Any]], keep: Callable[[dict[str, Any]], bool] = lambda _: True
    ) -> HostGaps:
        """Gaps (`core.host_gap`) after every kept record that the next record follows without an
        idle spell."""
        classes: list[list[float]] = [[] for _ in range(len(REQUEST_CLASSES) + 1)]
        previous: dict[str, Any] | None = None
        for record in records:
            if previous is not None and keep(previous) and (gap := gap_after(previous, record)) is not None:
                classes[cls.class_of(batch_requests(previous))].append(gap)
            previous = record
        if not any(classes):
            raise ValueError("no host gaps in these records: no two consecutive kept iterations")
        return cls(tuple(tuple(sorted(gaps)) for gaps in classes))

    @staticmethod
    def class_of(requests: int) -> int:
        return bisect.bisect_left(REQUEST_CLASSES, requests)

    @cached_property
    def _drawn_from(self) -> tuple[tuple[float, ...], ...]:
        """Per class, the gaps it draws from: its own if it has enough, else the nearest class's
        that has (the lower one on a tie). Resolved once: every simulated iteration asks."""
        sizes = [len(gaps) for gaps in self.by_class]
        enough = [index for index, size in enumerate(sizes) if size >= MIN_CLASS_GAPS]
        trusted = enough or [index for index, size in enumerate(sizes) if size]
        return tuple(
            self.by_class[min(trusted, key=lambda index: (abs(index - wanted), index))]
            for wanted in range(len(self.by_class))
        )

    def gaps_for(self, requests: int) -> tuple[float, ...]:
        """The measured gaps of batches of ``requests``' class, or of the nearest class with enough."""
        return self._drawn_from[self.class_of(requests)]

    def summary(self) -> list[dict[str, Any]]:
        """Per class: its bound, how many gaps, their median and P90 in ms (for a report)."""
        rows = []
        for index, gaps in enumerate(self.by_class):
            if gaps:
                bound = REQUEST_CLASSES[index] if index < len(REQUEST_CLASSES) else None
                rows.append(
                    {
                        "requests_below": bound,
                        "count": len(gaps),
                        "median_ms": round(float(np.median(gaps)) * 1000, 2),
                        "p90_ms": round(float(np.percentile(gaps, 90)) * 1000, 2),
                    }
                )
        return rows


class HostBoundClock:
    """A clock whose iteration lasts its forward or a host gap drawn for its batch size, whichever
    is longer: the emulated pacer's rule with this host's measured gaps.

    ``observer`` sees each batch's request count and its drawn gap, as the emulated engine's
    iteration records show them to a scheduler that learns the host's time (BROS's
    `core.host_gap.HostTime`); without it the simulated scheduler plans as if the host kept up,
    which the engine's does not."""

    def __init__(
        self, clock: IterationClock, host: HostGaps, seed: int = 0, observer: Callable[[int, float], None] | None = None
    ) -> None:
        self.clock = clock
        self.host = host
        self.observer = observer
        self._rng = np.random.default_rng(seed)

    def measure(self, shape: BatchShape) -> float:
        gaps = self.host.gaps_for(shape.requests)
        gap = gaps[int(self._rng.integers(len(gaps)))]
        if self.observer is not None:
            self.observer(shape.requests, gap)
        return max(self.clock.measure(shape), gap)
