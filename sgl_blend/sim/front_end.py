"""The front end in the simulator: an online request's time outside the engine, measured.

The simulator's engine is SGLang's scheduler alone: a request reaches it when it is sent, and its
first token reaches the client when the batch that made it ends. In a server, the request first
crosses HTTP, the tokenizer manager and its queue to the scheduler, and the token crosses the
detokenizer, the tokenizer manager and HTTP back. On the emulated engine's 2-core host those
processes share the cores with the scheduler and the replay client, and the crossing is most of
an online request's P99 time to first token (SGLang's own log shows its waiting queue empty at
every prefill of an online-only replay whose P99 is 3x the simulator's).

`FrontEnd.measure` reads the two crossings per request from one replay: the client's send and
first token (wall clock) and the iteration log's admissions (`sglang_plugin.iteration_log`:
``online_received``, when the scheduler received each request, in the batch that admitted it,
whose ``wall`` is its end). Online requests are received and admitted first come, first served,
so the k-th sent is the k-th received. `FrontEnd.add_to` adds to each simulated request a delay
drawn from those measured, whole (both crossings of one measured request): the simulated engine
itself is not moved, so requests the front end holds back do not bunch up at the scheduler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sgl_blend.core.request_timing import RequestTiming


@dataclass(frozen=True)
class FrontEnd:
    """Measured crossings in seconds, one ``(to_scheduler, from_scheduler)`` pair per request."""

    delays: tuple[tuple[float, float], ...]

    @classmethod
    def measure(cls, sent: Sequence[tuple[float, float | None]], records: Iterable[dict[str, Any]]) -> FrontEnd:
        """``sent``: each request's send (wall clock) and the client's time to first token;
        ``records``: the iteration records of the replay (only its requests admitted in them).
        Raises when a request has no first token or the records admit other than these requests."""
        if any(ttft is None for _, ttft in sent):
            raise ValueError("a request of the replay has no first token: its crossings cannot be measured")
        admitted = [(received, record["wall"]) for record in records for received in record.get("online_received", ())]
        if len(admitted) != len(sent):
            raise ValueError(f"the records admit {len(admitted)} online requests, the replay sent {len(sent)}")
        delays = []
        for (at, ttft), (received, batch_end) in zip(sorted(sent), sorted(admitted)):
            assert ttft is not None
            delays.append((received - at, at + ttft - batch_end))
        return cls(tuple(delays))

    def add_to(self, timings: Sequence[RequestTiming], seed: int) -> list[RequestTiming]:
        """``timings`` with each first token later by a measured request's two crossings."""
        rng = np.random.default_rng(seed)
        totals = [to + back for to, back in self.delays]
        return [
            timing if timing.ttft is None else dataclasses.replace(timing, ttft=timing.ttft + totals[draw])
            for timing, draw in zip(timings, rng.integers(len(totals), size=len(timings)))
        ]

    def summary(self) -> dict[str, float]:
        """Median and P99 of each crossing and of both, in milliseconds."""
        parts = np.array(self.delays)
        columns = {"to_scheduler": parts[:, 0], "from_scheduler": parts[:, 1], "both": parts.sum(axis=1)}
        return {
            f"{name}_{label}_ms": round(float(np.percentile(values, q)) * 1000, 1)
            for name, values in columns.items()
            for label, q in (("p50", 50), ("p99", 99))
        }
