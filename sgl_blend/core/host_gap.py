"""The host's gap between two forwards, read from consecutive iteration records
(`sglang_plugin.iteration_log`): the second's launch-to-launch ``period_s`` less the first's
``forward_s`` -- the time between a forward's end and the next launch, spent on result
processing, streaming and scheduling on the host. BROS's cost model learns it as the engine runs
(`core.bros.cost.HostTime`); the simulator replays the gaps an emulated run measured
(`sim.host`). Both read it, and the batch it follows, here.
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
