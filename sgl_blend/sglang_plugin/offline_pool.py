"""The scheduler-side offline pool: SGLang `Req`s on one side, an `AdmissionPolicy` on the other.

It owns no scheduling logic of its own. Each iteration it (1) reconciles what SGLang's waiting
queue holds with what the policy believes is pending -- new arrivals are submitted, retracted
requests reported as preempted, aborted ones withdrawn -- (2) asks the policy for a proposal and
reorders the waiting queue as online requests first, then the proposal, then the rest of the
offline requests, and (3) lets only proposed offline requests through SGLang's own `PrefillAdder`,
so token budgets, chunked prefill, radix locking and retraction stay SGLang's.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from sgl_blend.core.kv_priority import ReuserIndex
from sgl_blend.core.policy_log import RecordedPolicy
from sgl_blend.core.protocol import AdmissionPolicy, OfflineRequest
from sgl_blend.core.request_state import Status
from sgl_blend.offline import is_offline, placement_of

RECORD_LENGTH = 512
ADMISSION_RECORD_LENGTH = 20_000
# Offline requests proposed for one prefill: SGLang's chunk and memory still bound what it admits.
# 128 made a window of thousands of short lines enter 128 an iteration, in more mixed iterations than
# SGLang's own path takes (20,000 16-token lines, emulated H100, free forwards: 555 lines/s at 128,
# 632 at 512; bench.feed_rate).
MAX_PROPOSAL = 512
# A running request's decoded tokens reach the policy every this many tokens: between reports the
# scanner counts one per iteration since admission (never fewer than decoded), so a report only
# corrects that count. One per request per iteration cost the scheduler 12% more CPU (2.69 s against
# 2.36 s for 2,000 16-token lines on an emulated H100 with free forwards).
PROGRESS_STRIDE = 8


class SchedulerReq(Protocol):
    """The few fields of SGLang's `Req` the pool reads."""

    rid: str
    routing_key: str | None
    origin_input_ids: Any
    output_ids: Any
    sampling_params: Any

    def finished(self) -> bool: ...


@dataclass(eq=False, slots=True)
class Tracked:
    """An offline request the policy knows of, from its submission until it finishes or is
    withdrawn: PENDING while it waits in SGLang's queue, RUNNING once admitted."""

    status: Status = Status.PENDING
    proposed: bool = False
    """In the policy's latest proposal: SGLang may admit it now."""


def to_offline_request(req: SchedulerReq) -> OfflineRequest:
    params = req.sampling_params
    return OfflineRequest(
        rid=req.rid,
        prompt_ids=tuple(req.origin_input_ids),
        max_new_tokens=int(params.max_new_tokens),
        exact_output_len=bool(params.ignore_eos),
        placement=placement_of(req.routing_key),
    )


class OfflinePool:
    """One `Tracked` per offline request the policy knows of, by rid. ``reusers``, when given,
    counts the unfinished offline prompts per shared prefix for the radix cache's Echo
    priorities. ``record_calls`` keeps every call on the policy (see `RecordedPolicy`), for
    replaying a run through the simulator's policy driver."""

    def __init__(
        self,
        policy: AdmissionPolicy,
        policy_name: str,
        kv_capacity: int,
        reusers: ReuserIndex | None = None,
        record_calls: bool = False,
    ) -> None:
        self.policy = RecordedPolicy(policy) if record_calls else policy
        self.reusers = reusers
        self.policy_name = policy_name
        self.policy.set_kv_capacity(kv_capacity)
        self._tracked: dict[str, Tracked] = {}
        self._proposal: list[Tracked] = []
        self._iteration = 0
        self._records: deque[dict[str, Any]] = deque(maxlen=RECORD_LENGTH)
        # per admission: [iteration, rid, side, plan position, prefill tokens, prefill cap]
        self.admissions: deque[list[Any]] = deque(maxlen=ADMISSION_RECORD_LENGTH)
        self.prefill_cap: int | None = None
        self.counts: Counter[str] = Counter()
        self.plan_seconds = 0.0

    def order_waiting_queue(self, waiting_queue: list, free_kv_tokens: int) -> None:
        """Reorder SGLang's waiting queue in place: online first, then the policy's proposal."""
        online: list[SchedulerReq] = []
        offline: list[SchedulerReq] = []
        for req in waiting_queue:
            (offline if is_offline(req.routing_key) else online).append(req)
        for previous in self._proposal:
            previous.proposed = False
        self._proposal = []
        if not offline:
            return
        self._reconcile(offline)
        start = time.perf_counter()
        proposal = self.policy.propose(free_kv_tokens, MAX_PROPOSAL)
        self.plan_seconds += time.perf_counter() - start
        self._proposal = [tracked for request in proposal if (tracked := self._tracked.get(request.rid)) is not None]
        for tracked in self._proposal:
            tracked.proposed = True
        by_rid = {req.rid: req for req in offline}
        ordered = [by_rid[request.rid] for request in proposal if request.rid in by_rid]
        rest = [req for req in offline if not self._tracked[req.rid].proposed]
        waiting_queue[:] = online + ordered + rest

    def _reconcile(self, offline: list) -> None:
        """Bring the policy up to date with SGLang's waiting queue: a running request back in it
        was retracted, a new one arrived, and a pending one gone from it was aborted."""
        present = set()
        arrivals = []
        for req in offline:
            present.add(req.rid)
            tracked = self._tracked.get(req.rid)
            if tracked is None:
                arrivals.append(req)
            elif tracked.status is Status.RUNNING:
                tracked.status = Status.PENDING
                self.policy.preempted(req.rid)
                self.counts["preempted"] += 1
        gone = [
            rid for rid, tracked in self._tracked.items() if tracked.status is Status.PENDING and rid not in present
        ]
        for rid in gone:
            del self._tracked[rid]
            self.policy.withdraw(rid)
            self._forget_reuser(rid)
            self.counts["withdrawn"] += 1
        if arrivals:
            self.policy.submit(to_offline_request(req) for req in arrivals)
            if self.reusers is not None:
                for req in arrivals:
                    self.reusers.add(req.rid, req.origin_input_ids)
            for req in arrivals:
                self._tracked[req.rid] = Tracked()
            self.counts["submitted"] += len(arrivals)

    def may_admit(self, req: SchedulerReq) -> bool:
        """Online requests always; offline requests only when the policy proposed them."""
        if not is_offline(req.routing_key):
            return True
        tracked = self._tracked.get(req.rid)
        return tracked is not None and tracked.proposed

    def prefill_budget(self) -> int | None:
        """The policy's prefill tokens for this iteration (None: SGLang's chunk stands)."""
        return self.policy.prefill_token_budget()

    def on_prefill_continues(self, req: SchedulerReq) -> None:
        """SGLang gave a chunked offline request its next chunk: its prefix is not cached yet."""
        tracked = self._tracked.get(req.rid)
        if tracked is not None and tracked.status is Status.RUNNING:
            self.policy.prefill_continues(req.rid)

    def on_admitted(self, req: SchedulerReq, tree_cache: Any = None) -> None:
        tracked = self._tracked.get(req.rid)
        if tracked is not None and tracked.status is Status.PENDING:
            annotation = self.policy.annotation(req.rid)
            tracked.status = Status.RUNNING
            self.policy.admitted([req.rid])
            self.counts["admitted"] += 1
            placement = placement_of(req.routing_key)
            self.admissions.append(
                [
                    self._iteration,
                    req.rid,
                    self.policy.admission_side(req.rid),
                    placement.position if placement else None,
                    int(getattr(req, "extend_len", 0) or 0),
                    self.prefill_cap,
                ]
            )
            annotate = getattr(tree_cache, "annotate_path", None)
            last_node = getattr(req, "last_node", None)
            if annotate is not None and annotation is not None and last_node is not None:
                self.counts["annotated_nodes"] += annotate(last_node, *annotation)

    def on_batch_result(self, reqs: Iterable[SchedulerReq]) -> None:
        """Report progress and completions, and record which scan sides share this batch."""
        self._iteration += 1
        self.policy.advance(1)
        sides: Counter[str] = Counter()
        for req in reqs:
            tracked = self._tracked.get(req.rid)
            if tracked is None or tracked.status is not Status.RUNNING:
                sides["online" if not is_offline(req.routing_key) else "untracked"] += 1
                continue
            sides[self.policy.admission_side(req.rid) or "single"] += 1
            if req.finished():
                del self._tracked[req.rid]
                self.policy.finished(req.rid, len(req.output_ids))
                self._forget_reuser(req.rid)
                self.counts["finished"] += 1
            elif len(req.output_ids) % PROGRESS_STRIDE == 0:
                self.policy.progress(req.rid, len(req.output_ids))
        if sides["compute"] and sides["memory"]:
            self.counts["blended_iterations"] += 1
        if any(side in sides for side in ("compute", "memory", "single")):
            self._records.append({"iteration": self._iteration, **sides})

    def _forget_reuser(self, rid: str) -> None:
        if self.reusers is not None:
            self.reusers.remove(rid)

    def snapshot(self) -> dict[str, Any]:
        """What the plugin publishes through `/server_info`."""
        statuses = Counter(tracked.status for tracked in self._tracked.values())
        return {
            "policy": self.policy_name,
            "pending": statuses[Status.PENDING],
            "running": statuses[Status.RUNNING],
            "counts": dict(self.counts),
            "plan_seconds": round(self.plan_seconds, 4),
            "iterations": list(self._records),
            "admissions": list(self.admissions),
            **({"policy_calls": self.policy.events} if isinstance(self.policy, RecordedPolicy) else {}),
        }
