"""Online loads named by how much of the engine online-only serving uses, not by a request rate.

"Low load" means nothing until it says how busy the engine is: the same 2 req/s is idle time on
one engine and a queue on another. The co-location benches therefore choose each online rate so
that the online-only run's utilisation (engine busy time over wall time, measured on the run
itself) lands on a target, by bisecting the rate in log space: utilisation grows with the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class LoadPick:
    """The rate chosen for ``target`` and the utilisation measured at it; ``trials`` are every
    ``(rate, utilisation)`` measured on the way."""

    target: float
    rate: float
    utilisation: float
    trials: list[tuple[float, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"target": self.target, "rate_per_s": self.rate, "utilisation": self.utilisation,
                "trials": [{"rate_per_s": rate, "utilisation": util} for rate, util in self.trials]}


def pick_rate(utilisation_at: Callable[[float], float], target: float, low: float, high: float, steps: int,
              tolerance: float) -> LoadPick:
    """Bisect ``rate`` in ``[low, high]`` (log space) for ``utilisation_at(rate)`` within
    ``tolerance`` of ``target``, at most ``steps`` measurements; returns the closest one measured."""
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got low={low}, high={high}")
    if steps < 1:
        raise ValueError("picking a load needs at least one measurement")
    trials: list[tuple[float, float]] = []
    for _ in range(steps):
        rate = math.sqrt(low * high)
        utilisation = utilisation_at(rate)
        trials.append((rate, utilisation))
        if abs(utilisation - target) <= tolerance:
            break
        if utilisation < target:
            low = rate
        else:
            high = rate
    rate, utilisation = min(trials, key=lambda trial: abs(trial[1] - target))
    return LoadPick(target, rate, utilisation, trials)
