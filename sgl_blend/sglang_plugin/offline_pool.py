"""The scheduler-side offline pool: SGLang `Req`s on one side, the offline policy's worker on the other.

SGLang's scheduler walks its whole waiting queue every iteration (its policy's sort, the prefill
adder's scan, the load report), so offline lines do not wait there: an offline request that
arrives is taken out of the queue into the pool's backlog, and the queue holds only what the
policy proposes for the next steps, besides online requests. The policy itself runs one step
ahead in its worker (`core.policy_worker`): each iteration the pool sends it what happened --
arrivals, admissions, progress, completions, retractions, aborts -- as one message, and admits
from the newest proposal the worker has answered with, never waiting for one. So what the loop
pays per iteration is the requests it touches, not the offline lines queued.

Only proposed offline requests pass SGLang's own `PrefillAdder` (`may_admit`), so token budgets,
chunked prefill, radix locking and retraction stay SGLang's. A request retracted from the running
batch is reported preempted and waits in the backlog until proposed again; an abort reaches the
backlog too (`before_abort`), since SGLang's abort looks only at its own queue.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from sgl_blend.core.kv_priority import ReuserIndex
from sgl_blend.core.policy_worker import Event, PolicyLink, Proposal, Proposed
from sgl_blend.core.protocol import OfflineRequest
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
    """An offline request the policy knows of, from its arrival until it finishes or is withdrawn:
    PENDING while it waits (in the backlog, or proposed in SGLang's queue), RUNNING once admitted."""

    req: Any
    status: Status = Status.PENDING
    side: str | None = None
    """The scan side it was admitted from (None: a single-order policy)."""


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
    """One `Tracked` per offline request the policy knows of, by rid; ``backlog``: those waiting
    outside SGLang's queue, in arrival order. ``reusers``, when given, counts the unfinished
    offline prompts per shared prefix for the radix cache's Echo priorities."""

    def __init__(
        self,
        link: PolicyLink,
        policy_name: str,
        backlog: dict[str, Any],
        reusers: ReuserIndex | None = None,
        record_calls: bool = False,
    ) -> None:
        self.link = link
        self.record_calls = record_calls
        self.reusers = reusers
        self.policy_name = policy_name
        self.backlog = backlog
        self._tracked: dict[str, Tracked] = {}
        self._events: list[Event] = []
        self._proposal: dict[str, tuple[int, Proposed]] = {}
        self._budget: int | None = None
        self._last: Proposal | None = None
        self._sent = 0
        self._iteration = 0
        self._records: deque[dict[str, Any]] = deque(maxlen=RECORD_LENGTH)
        # per admission: [iteration, rid, side, plan position, prefill tokens, prefill cap]
        self.admissions: deque[list[Any]] = deque(maxlen=ADMISSION_RECORD_LENGTH)
        self.prefill_cap: int | None = None
        self.counts: Counter[str] = Counter()

    # What arrives and leaves

    def arrive(self, req: Any, waiting_queue: list) -> None:
        """A new offline request SGLang has just queued: it waits in the backlog instead."""
        if req.rid in self._tracked:
            return
        if waiting_queue and waiting_queue[-1] is req:
            waiting_queue.pop()
        elif any(queued is req for queued in waiting_queue):
            waiting_queue.remove(req)
        else:
            return  # SGLang refused it (its queue limit, a bad priority) and answered it already
        self._tracked[req.rid] = Tracked(req)
        self.backlog[req.rid] = req
        self._events.append(("submit", [to_offline_request(req)]))
        if self.reusers is not None:
            self.reusers.add(req.rid, req.origin_input_ids)
        self.counts["submitted"] += 1

    def retracted(self, req: Any) -> None:
        """SGLang put a running offline request back into its queue: pending again, proposed anew."""
        tracked = self._tracked.get(req.rid)
        if tracked is not None and tracked.status is Status.RUNNING:
            tracked.status = Status.PENDING
            self._events.append(("preempted", req.rid))
            self.counts["preempted"] += 1

    def before_abort(self, waiting_queue: list, rid: str, abort_all: bool) -> list[str]:
        """SGLang is about to abort ``rid`` (a prefix of request ids) or everything: the matching
        requests of the backlog join its queue, where its abort finds them. Returns the pending
        rids it may withdraw."""
        matched = [
            key
            for key, tracked in self._tracked.items()
            if tracked.status is Status.PENDING and (abort_all or key.startswith(rid))
        ]
        for key in matched:
            req = self.backlog.pop(key, None)
            if req is not None:
                waiting_queue.append(req)
        return matched

    def after_abort(self, waiting_queue: list, matched: list[str]) -> None:
        """Pending requests SGLang's abort took out of its queue never run: the policy forgets them."""
        if not matched:
            return
        queued = {req.rid for req in waiting_queue}
        for rid in matched:
            if rid not in queued and rid in self._tracked:
                self._forget(rid)
                self._events.append(("withdraw", rid))
                self.counts["withdrawn"] += 1

    def _forget(self, rid: str) -> None:
        del self._tracked[rid]
        self.backlog.pop(rid, None)
        self._proposal.pop(rid, None)
        if self.reusers is not None:
            self.reusers.remove(rid)

    # Each iteration

    def release(self, waiting_queue: list, free_kv_tokens: int) -> None:
        """Before SGLang builds a prefill batch: send the worker what happened since the last
        iteration, take its newest proposal, and make SGLang's queue hold the proposed offline
        requests (online ones stay; pending ones no longer proposed go back to the backlog)."""
        self._send(free_kv_tokens)
        proposal = self.link.latest()
        if proposal is not None:
            self._take(proposal)
        keep: list[Any] = []
        proposed_here: list[Any] = []
        for req in waiting_queue:
            tracked = self._tracked.get(req.rid) if is_offline(req.routing_key) else None
            if tracked is None or tracked.status is not Status.PENDING:
                keep.append(req)  # online, or not the pool's (it arrived before the pool existed)
            elif req.rid in self._proposal:
                proposed_here.append(req)
            else:
                self.backlog[req.rid] = req
        released = [self.backlog.pop(rid) for rid in self._proposal if rid in self.backlog]
        waiting_queue[:] = keep + proposed_here + released

    def _send(self, free_kv_tokens: int) -> None:
        """One message per iteration, asking for a proposal. With nothing to report, only when
        requests wait, none is proposed, and the worker has answered every message: the engine may
        be idle, with no result to report that would ask again."""
        if not self._events:
            answered = self._last is not None and self._last.seen >= self._sent
            if not (self.backlog and not self._proposal and (answered or self._sent == 0)):
                return
        self._events.append(("propose", free_kv_tokens, MAX_PROPOSAL))
        events, self._events = self._events, []
        self.link.send(events)
        self._sent += 1

    def _take(self, proposal: Proposal) -> None:
        self._last = proposal
        self._budget = proposal.prefill_budget
        self._proposal = {
            entry.rid: (rank, entry)
            for rank, entry in enumerate(proposal.requests)
            if (tracked := self._tracked.get(entry.rid)) is not None and tracked.status is Status.PENDING
        }

    def order_waiting_queue(self, waiting_queue: list) -> None:
        """After SGLang's own ordering: online first, then the proposal's order."""
        online: list[Any] = []
        offline: list[Any] = []
        for req in waiting_queue:
            (offline if is_offline(req.routing_key) else online).append(req)
        if offline:
            last = len(self._proposal)
            offline.sort(key=lambda req: self._proposal.get(req.rid, (last, None))[0])
            waiting_queue[:] = online + offline

    def may_admit(self, req: SchedulerReq) -> bool:
        """Online requests always; offline requests only when the policy proposed them."""
        return not is_offline(req.routing_key) or req.rid in self._proposal

    def prefill_budget(self) -> int | None:
        """The policy's prefill tokens for this iteration (None: SGLang's chunk stands)."""
        return self._budget

    def on_prefill_continues(self, req: SchedulerReq) -> None:
        """SGLang gave a chunked offline request its next chunk: its prefix is not cached yet."""
        tracked = self._tracked.get(req.rid)
        if tracked is not None and tracked.status is Status.RUNNING:
            self._events.append(("prefill_continues", req.rid))

    def on_admitted(self, req: SchedulerReq, tree_cache: Any = None) -> None:
        tracked = self._tracked.get(req.rid)
        if tracked is None or tracked.status is not Status.PENDING:
            return
        proposed = self._proposal.pop(req.rid, None)
        entry = proposed[1] if proposed is not None else None
        tracked.status = Status.RUNNING
        tracked.side = entry.side if entry is not None else None
        self._events.append(("admitted", [req.rid]))
        self.counts["admitted"] += 1
        placement = placement_of(req.routing_key)
        self.admissions.append(
            [
                self._iteration,
                req.rid,
                entry.side if entry is not None else None,
                placement.position if placement else None,
                int(getattr(req, "extend_len", 0) or 0),
                self.prefill_cap,
            ]
        )
        annotate = getattr(tree_cache, "annotate_path", None)
        last_node = getattr(req, "last_node", None)
        if annotate is not None and entry is not None and entry.annotation is not None and last_node is not None:
            self.counts["annotated_nodes"] += annotate(last_node, *entry.annotation)

    def on_batch_result(self, reqs: Iterable[SchedulerReq]) -> None:
        """Report progress and completions, and record which scan sides share this batch."""
        self._iteration += 1
        if self._tracked:  # the policy's clock; an engine with no offline work owes the worker nothing
            self._events.append(("advance", 1))
        sides: Counter[str] = Counter()
        for req in reqs:
            tracked = self._tracked.get(req.rid)
            if tracked is None or tracked.status is not Status.RUNNING:
                sides["online" if not is_offline(req.routing_key) else "untracked"] += 1
                continue
            sides[tracked.side or "single"] += 1
            if req.finished():
                self._forget(req.rid)
                self._events.append(("finished", req.rid, len(req.output_ids)))
                self.counts["finished"] += 1
            elif len(req.output_ids) % PROGRESS_STRIDE == 0:
                self._events.append(("progress", req.rid, len(req.output_ids)))
        if sides["compute"] and sides["memory"]:
            self.counts["blended_iterations"] += 1
        if any(side in sides for side in ("compute", "memory", "single")):
            self._records.append({"iteration": self._iteration, **sides})

    def snapshot(self) -> dict[str, Any]:
        """What the plugin publishes through `/server_info`."""
        statuses = Counter(tracked.status for tracked in self._tracked.values())
        last = self._last
        return {
            "policy": self.policy_name,
            "worker": self.link.kind,
            "pending": statuses[Status.PENDING],
            "running": statuses[Status.RUNNING],
            "backlog": len(self.backlog),
            "counts": dict(self.counts),
            "plan_seconds": round(last.plan_seconds, 4) if last is not None else 0.0,
            "worker_behind": self._sent - last.seen if last is not None else self._sent,
            "iterations": list(self._records),
            "admissions": list(self.admissions),
            **({"policy_calls": self.link.recorded_calls()} if self.record_calls else {}),
        }
