"""BROS's service metrics, folded in as tokens appear so a long-running server keeps O(live) state.

- Normalized latency: the mean over finished RT requests of end-to-end latency divided by
  output tokens.
- TTFT attainment: the share of RT requests whose first token came within the TTFT SLO (each
  request has one first token, so per token and per request agree); a summary taken at a given
  time also counts the requests still waiting past their deadline.
- TPOT attainment per token (BROS's fine-grained form): the share of inter-token gaps within
  the TPOT SLO; per request: the share of requests whose mean gap is within it.
- Token attainment: every RT token against its own deadline, first and later ones together.
- BE throughput: finished BE requests per second of the measured span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sgl_blend.core.bros.requests import SLO


@dataclass(slots=True)
class _Live:
    realtime: bool
    arrival: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0


class ServiceMetrics:
    def __init__(self, slo: SLO, start: float = 0.0) -> None:
        self.slo = slo
        self.start = start
        self.end = start
        self._live: dict[str, _Live] = {}
        self.rt_finished = 0
        self.be_finished = 0
        self.be_tokens = 0
        self._normalized_sum = 0.0
        self._ttft_met = 0
        self._first_tokens = 0
        self._gaps = 0
        self._gaps_met = 0
        self._tpot_requests = 0
        self._tpot_requests_met = 0

    def arrived(self, rid: str, realtime: bool, now: float) -> None:
        self._live[rid] = _Live(realtime, now)

    def received(self, rid: str, now: float) -> None:
        """Latency counts from arrival, as a client's does: when the loop took a request in
        changes nothing here."""

    def token(self, rid: str, now: float, count: int = 1) -> None:
        """``count`` tokens of ``rid`` became visible at ``now`` (a stream chunk may carry several;
        the gaps between them are spread evenly)."""
        live = self._live.get(rid)
        if live is None or count <= 0:
            return
        self.end = max(self.end, now)
        if not live.realtime:
            self.be_tokens += count
            live.tokens += count
            return
        if live.first is None:
            live.first = live.last = now
            live.tokens += 1
            self._first_tokens += 1
            self._ttft_met += now - live.arrival <= self.slo.ttft_s
            count -= 1
        if count:
            assert live.last is not None, "set with the first token, here or on an earlier call"
            gap = (now - live.last) / count
            met = count if gap <= self.slo.tpot_s else 0
            self._gaps += count
            self._gaps_met += met
            live.tokens += count
        live.last = now

    def finished(self, rid: str, now: float) -> None:
        live = self._live.pop(rid, None)
        if live is None:
            return
        self.end = max(self.end, now)
        if not live.realtime:
            self.be_finished += 1
            return
        self.rt_finished += 1
        self._normalized_sum += (now - live.arrival) / max(live.tokens, 1)
        if live.tokens > 1 and live.first is not None and live.last is not None:
            self._tpot_requests += 1
            self._tpot_requests_met += (live.last - live.first) / (live.tokens - 1) <= self.slo.tpot_s

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """With ``now``, RT requests still without a first token whose TTFT deadline has passed
        count as misses: under overload, the requests never served are the worst ones, and an
        attainment over served requests alone would hide them."""
        span = self.end - self.start
        missed = 0
        if now is not None:
            missed = sum(
                1
                for live in self._live.values()
                if live.realtime and live.first is None and now - live.arrival > self.slo.ttft_s
            )

        def share(part: int, whole: int) -> float | None:
            return part / whole if whole else None

        return {
            "rt_finished": self.rt_finished,
            "be_finished": self.be_finished,
            "normalized_latency_s": self._normalized_sum / self.rt_finished if self.rt_finished else None,
            "ttft_attainment": share(self._ttft_met, self._first_tokens + missed),
            "rt_never_served_past_ttft": missed,
            "tpot_attainment_per_token": share(self._gaps_met, self._gaps),
            "tpot_attainment_per_request": share(self._tpot_requests_met, self._tpot_requests),
            "token_attainment": share(self._ttft_met + self._gaps_met, self._first_tokens + missed + self._gaps),
            "be_requests_per_s": self.be_finished / span if span > 0 else None,
            "be_tokens_per_s": self.be_tokens / span if span > 0 else None,
            "span_s": span,
            "ttft_slo_s": self.slo.ttft_s,
            "tpot_slo_s": self.slo.tpot_s,
        }
