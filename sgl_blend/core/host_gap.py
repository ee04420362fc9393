"""The host's gap between two forwards, read from consecutive iteration records
(`sglang_plugin.iteration_log`): the second's launch-to-launch ``period_s`` less the first's
``forward_s`` -- the time between a forward's end and the next launch, spent on result
processing, streaming and scheduling on the host. BROS's cost model and HyGen's and Echo's plans
learn it as the engine runs (`HostTime`); the simulator replays the gaps an emulated run measured
(`sim.host`). All read it, and the batch it follows, here.

A launch-to-launch period is not the time between a batch's tokens. The emulated pacer starts a
forward when the one before ended, whenever the host hands it over (`emulation.realtime`), so a
batch's tokens leave the device ``max(price, gap)`` after the previous batch's, while its period
is the previous batch's forward plus this gap: ``price(n-1) - gap(n-1) + gap(n)``, one batch
late and with the host's jitter twice. On online-only replays at 30% load (1,000 requests, three
seeds) the per-token P99 of periods was 11.2-11.4 ms and of ends 9.0-9.9 ms, medians both 4.9 ms
(docs/colocation-history.md, "HyGen's budget searched from 4 ms, in a slow spell").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def batch_requests(record: Mapping[str, Any]) -> int:
    """The requests a recorded batch carried, prefill and decode."""
    return int(record["decode_reqs"]) + int(record["prefill_reqs"])


def gap_after(previous: Mapping[str, Any], record: Mapping[str, Any]) -> float | None:
    """The host's seconds after ``previous``'s forward, up to ``record``'s launch; None when
    ``record`` follows an idle spell (the recorder starts no period then). A period a little
    under the rounded forward is a gap of 0."""
    if "period_s" not in record:
        return None
    return max(0.0, record["period_s"] - previous["forward_s"])


def end_to_end(previous: Mapping[str, Any], record: Mapping[str, Any]) -> float | None:
    """Seconds from ``previous``'s end to ``record``'s: how long ``record``'s tokens came after the
    ones before (module docstring); None after an idle spell, as `gap_after`."""
    if "period_s" not in record:
        return None
    return record["period_s"] + record["forward_s"] - previous["forward_s"]


# Iterations `HostTime` remembers: its sums forget at 1/HOST_WINDOW per observation. BROS's
# records on the 2-core host (30% load, evaluation seed 1) ran about 17 iterations a second, so
# the fit follows the host's load over the last twelve seconds or so.
HOST_WINDOW = 200


class HostTime:
    """``seconds = intercept + per_request · requests``: the host's gap between a forward's end
    and the next launch, fitted by exponentially forgetting least squares on measured gaps. It
    predicts 0 until two batch sizes have been seen (a GPU server whose host keeps up measures
    gaps near 0 and keeps predicting about that)."""

    def __init__(self, window: int = HOST_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"the host-time window must be at least one iteration, got {window}")
        self.decay = 1.0 - 1.0 / window
        # weighted sums of 1, n, n², gap and n·gap
        self._sums = [0.0, 0.0, 0.0, 0.0, 0.0]
        self.intercept_s = 0.0
        self.per_request_s = 0.0

    def observe(self, requests: int, gap_s: float) -> None:
        sums, decay, n = self._sums, self.decay, float(requests)
        for index, value in enumerate((1.0, n, n * n, gap_s, n * gap_s)):
            sums[index] = sums[index] * decay + value
        weight, total_n, total_nn, total_gap, total_ngap = sums
        spread = weight * total_nn - total_n * total_n
        if spread <= 1e-9 * max(weight * total_nn, 1.0):
            return
        slope = (weight * total_ngap - total_n * total_gap) / spread
        self.per_request_s = max(slope, 0.0)
        self.intercept_s = max((total_gap - self.per_request_s * total_n) / weight, 0.0)

    def seconds(self, requests: int) -> float:
        return self.intercept_s + self.per_request_s * requests
