"""The host's gap between two forwards, read from consecutive iteration records
(`sglang_plugin.iteration_log`): the second's launch-to-launch ``period_s`` less the first's
``forward_s`` -- the time between a forward's end and the next launch, spent on result
processing, streaming and scheduling on the host. BROS's cost model learns it as the engine runs
(`core.bros.cost.HostTime`); the simulator replays the gaps an emulated run measured
(`sim.host`). Both read it, and the batch it follows, here.

A launch-to-launch period is not the time between a batch's tokens. The emulated pacer starts a
forward when the one before ended, whenever the host hands it over (`emulation.realtime`), so a
batch's tokens leave the device ``max(price, gap)`` after the previous batch's, while its period
is the previous batch's forward plus this gap: ``price(n-1) - gap(n-1) + gap(n)``, one batch
late and with the host's jitter twice. On online-only replays at 30% load (1,000 requests, three
seeds) the per-token P99 of periods was 11.2-11.4 ms and of ends 9.0-9.9 ms, medians both 4.9 ms
(docs/results.md, "HyGen's budget searched from 4 ms, in a slow spell").
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
