"""A record of every call an engine makes on its admission policy, and its replay.

The plugin inside SGLang and the simulator drive the same `AdmissionPolicy`; the record is how a
test shows it: a run of the real engine is recorded call by call (what arrived, what memory was
offered, what was admitted, how many iterations ran, what finished), and the same calls replayed
on a fresh policy must produce the same proposals and prefill budgets. Events are plain JSON
lists so the record can leave the scheduler process through ``/server_info``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sgl_blend.core.placement import Placement
from sgl_blend.core.protocol import AdmissionPolicy, OfflineRequest

Event = list[Any]


class RecordedPolicy:
    """An `AdmissionPolicy` that forwards every call to ``inner`` and appends it to ``events``
    with its result. Calls that do not change the policy's state and are not decisions
    (``admission_side``, ``annotation``, ``pending_count``) pass through unrecorded."""

    def __init__(self, inner: AdmissionPolicy, limit: int = 200_000) -> None:
        self.inner = inner
        self.events: list[Event] = []
        self.limit = limit

    def _log(self, *event: Any) -> None:
        if len(self.events) < self.limit:
            self.events.append(list(event))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def set_kv_capacity(self, kv_tokens: int) -> None:
        self._log("capacity", int(kv_tokens))
        self.inner.set_kv_capacity(kv_tokens)

    def submit(self, requests: Iterable[OfflineRequest]) -> None:
        requests = list(requests)
        self._log(
            "submit",
            [
                [
                    r.rid,
                    list(r.prompt_ids),
                    r.max_new_tokens,
                    r.exact_output_len,
                    r.placement.encode() if r.placement else None,
                ]
                for r in requests
            ],
        )
        self.inner.submit(requests)

    def propose(self, free_kv_tokens: int, max_requests: int) -> list[OfflineRequest]:
        proposal = self.inner.propose(free_kv_tokens, max_requests)
        self._log("propose", int(free_kv_tokens), int(max_requests), [r.rid for r in proposal])
        return proposal

    def admitted(self, rids: Iterable[str]) -> None:
        rids = list(rids)
        self._log("admitted", rids)
        self.inner.admitted(rids)

    def prefill_continues(self, rid: str) -> None:
        self._log("prefill_continues", rid)
        self.inner.prefill_continues(rid)

    def progress(self, rid: str, decoded_tokens: int) -> None:
        self._log("progress", rid, int(decoded_tokens))
        self.inner.progress(rid, decoded_tokens)

    def preempted(self, rid: str) -> None:
        self._log("preempted", rid)
        self.inner.preempted(rid)

    def finished(self, rid: str, output_len: int) -> None:
        self._log("finished", rid, int(output_len))
        self.inner.finished(rid, output_len)

    def withdraw(self, rid: str) -> None:
        self._log("withdraw", rid)
        self.inner.withdraw(rid)

    def advance(self, iterations: int) -> None:
        self._log("advance", int(iterations))
        self.inner.advance(iterations)

    def prefill_token_budget(self) -> int | None:
        budget = self.inner.prefill_token_budget()
        self._log("budget", budget)
        return budget


def replay(events: Iterable[Event], policy: AdmissionPolicy) -> list[str]:
    """Apply recorded calls to ``policy``; returns every decision that came out differently
    (empty when the policy reproduces the recorded run)."""
    mismatches = []
    for number, event in enumerate(events):
        kind, args = event[0], event[1:]
        if kind == "capacity":
            policy.set_kv_capacity(args[0])
        elif kind == "submit":
            policy.submit(
                OfflineRequest(rid, tuple(ids), max_new, exact, Placement.decode(text) if text else None)
                for rid, ids, max_new, exact, text in args[0]
            )
        elif kind == "propose":
            got = [request.rid for request in policy.propose(args[0], args[1])]
            if got != args[2]:
                mismatches.append(f"event {number}: proposed {got[:5]}... instead of {args[2][:5]}...")
        elif kind == "budget":
            budget = policy.prefill_token_budget()
            if budget != args[0]:
                mismatches.append(f"event {number}: prefill budget {budget} instead of {args[0]}")
        else:
            getattr(policy, kind)(*args)
    return mismatches
