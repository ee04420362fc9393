"""The front end in the simulator: an online request's time outside the engine, measured.

The simulator's engine is SGLang's scheduler alone: a request reaches it when it is sent, and its
first token reaches the client when the batch that made it ends. In a server, the request first
crosses HTTP, the tokenizer manager and its queue to the scheduler, and the token crosses the
detokenizer, the tokenizer manager and HTTP back. On the emulated engine's 2-core host those
processes share the cores with the scheduler and the replay client, and the crossing is most of
an online request's P99 time to first token (SGLang's own log shows its waiting queue empty at
every prefill of an online-only replay whose P99 is 3x the simulator's).

`FrontEnd.measure` reads the two crossings per request from one replay: the client's send and
first token (wall clock) and the iteration log (`sglang_plugin.iteration_log`): ``online_received``
in the batch that admitted a request holds when the scheduler received it, and
``online_prefilled``, in the batch that completed its prompt, that same receipt; that batch's end
(``wall``) is the first token's. Online requests are received first come, first served, so the
k-th sent is the k-th received. The way to the scheduler so measured ends when the
scheduler's loop takes the request in, so it holds the wait for the iteration under way; the
simulated engine has that wait too (`RequestTiming.received`), so `FrontEnd.add_to` replaces it:
a simulated first token reaches the client at its engine's time from receipt, plus both crossings
of one measured request, drawn whole. The simulated engine itself is not moved, so requests the
front end holds back do not bunch up at the scheduler.
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
        Raises when a request has no first token, or the records admit other than these requests or
        do not hold one's first token."""
        if any(ttft is None for _, ttft in sent):
            raise ValueError("a request of the replay has no first token: its crossings cannot be measured")
        records = list(records)
        received = sorted(at for record in records for at in record.get("online_received", ()))
        if len(received) != len(sent):
            raise ValueError(f"the records admit {len(received)} online requests, the replay sent {len(sent)}")
        first_token: dict[float, list[float]] = {}
        for record in sorted(records, key=lambda record: record["wall"]):
            for at in record.get("online_prefilled", ()):
                first_token.setdefault(at, []).append(record["wall"])
        delays = []
        for (at, ttft), taken in zip(sorted(sent), received):
            assert ttft is not None
            ends = first_token.get(taken)
            if not ends:
                raise ValueError(f"no record holds the first token of the request received at {taken}")
            delays.append((taken - at, at + ttft - ends.pop(0)))
        return cls(tuple(delays))

    def add_to(self, timings: Sequence[RequestTiming], seed: int) -> list[RequestTiming]:
        """Simulated ``timings`` with each first token reaching the client across the front end: a
        measured request's two crossings in place of the simulated wait before receipt."""
        rng = np.random.default_rng(seed)
        totals = [to + back for to, back in self.delays]
        crossed = []
        for timing, draw in zip(timings, rng.integers(len(totals), size=len(timings))):
            if timing.ttft is not None:
                if timing.received is None:
                    raise ValueError("a simulated request without its receipt: its wait would be counted twice")
                timing = dataclasses.replace(timing, ttft=timing.ttft - timing.received + totals[draw])
            crossed.append(timing)
        return crossed

    def summary(self) -> dict[str, float]:
        """Median and P99 of each crossing and of both, in milliseconds."""
        parts = np.array(self.delays)
        columns = {"to_scheduler": parts[:, 0], "from_scheduler": parts[:, 1], "both": parts.sum(axis=1)}
        return {
            f"{name}_{label}_ms": round(float(np.percentile(values, q)) * 1000, 1)
            for name, values in columns.items()
            for label, q in (("p50", 50), ("p99", 99))
        }
