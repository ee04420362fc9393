"""Co-location plans carried out with SGLang's own mechanisms: scheduler state in, `core.colocation` plans out.

- the view: the scheduler's running batch, the decodes held out of it and the waiting queue become
  an `IterationView`;
- parking holds: an offline decode the plan skips leaves the running batch with its KV resident
  (`held_decodes`, as BROS holds its best-effort decodes) and is put back, without recompute, in
  the first iteration whose plan keeps it;
- preemption retracts: an offline request whose memory online work needs (or whose request slot
  an online request needs) is released with its KV checkpointed into the radix cache and goes back
  to the waiting queue, from where it resumes by prefilling what the cache no longer holds;
- offline prefill: the prefill adder caps each offline chunk at what the plan's budget allows
  and makes a truncated offline chunk the pass's last admission (SGLang tracks one chunked
  request at a time);
- online admission: an online request short of KV takes it from running offline work;
- Echo's selection: after the offline pool has ordered the waiting queue, the first offline
  requests in its order become `OfflineCandidate`s (matched against the radix cache for their
  resident prefix, counted against the pool's reuser index), the controller picks among them, and
  the queue is reordered so the picked ones come first, in the selector's order; the adder admits
  those, each chunk capped by the selection, and stops at the first one not picked.

Nothing here decides; it only translates. `ColocationState` is what the mode keeps between calls.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

from sgl_blend.core.colocation import (
    ColocationConfig,
    ColocationController,
    IterationPlan,
    IterationView,
    RunningRequest,
    WaitingOnline,
)
from sgl_blend.core.echo_plan import CANDIDATE_WINDOW, OfflineCandidate
from sgl_blend.core.kv_priority import ReuserIndex
from sgl_blend.offline import is_offline
from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.held_decodes import HeldDecodes, in_flight
from sgl_blend.sglang_plugin.modes.base import add_within_chunk
from sgl_blend.sglang_plugin.modes.parked_kv import ParkedKV

KEPT_RESUMES = 256


class ColocationState:
    """``held`` is the mode's: it outlives a state that fails, so the held decodes can be given back."""

    def __init__(self, config: ColocationConfig, held: HeldDecodes) -> None:
        self.controller = ColocationController(config)
        self.plan: IterationPlan | None = None
        self.counts: Counter[str] = Counter()
        self.parked = ParkedKV()
        self.held = held
        self.resumes: deque[dict[str, Any]] = deque(maxlen=KEPT_RESUMES)
        # What Echo's selection needs of this prefill pass beyond the plan: the offline chunked
        # prefill under way (extend, prefix, max new tokens), and whether a new one may start.
        self.continuing: tuple[int, int, int] | None = None
        self.may_truncate = False
        # The last batch's record, until the next launch measures its period and the host's gap.
        self.previous_record: dict[str, Any] | None = None

    def snapshot(self) -> dict[str, Any]:
        config = self.controller.config
        return {
            "mode": config.mode,
            "latency_budget_s": config.latency_budget_s,
            "headroom_s": config.headroom_s,
            "latency_model": (config.latency_model or {}).get("form"),
            "calibration": round(self.controller.calibration, 4),
            "counts": dict(self.counts),
            "held": self.held.snapshot(),
            "parked_now": len(self.parked),
            "pinned_tokens": self.parked.pinned_tokens(),
            "dropped_pinned_tokens": self.parked.dropped_tokens,
            "resumes": list(self.resumes),
        }


def remaining_output(req: Any) -> int:
    return max(int(req.sampling_params.max_new_tokens) - len(req.output_ids), 0)


def _context(req: Any) -> int:
    return len(req.origin_input_ids) + len(req.output_ids)


def shared_with_others(req: Any) -> int:
    """Tokens of ``req``'s cached path that another lock also covers (another running request on
    the prefix, a parked request's pin): they stay resident if ``req`` is preempted. Every lock
    covers a whole root path, so they are the path from the deepest node locked more than once."""
    node = getattr(req, "last_node", None)
    while node is not None and node.parent is not None and getattr(node, "lock_ref", 0) <= 1:
        node = node.parent
    shared = 0
    while node is not None and node.parent is not None:
        shared += len(node.key)
        node = node.parent
    return shared


def iteration_view(
    scheduler: Any, running_batch: Any, parked_tokens: int = 0, shares: bool = False, held: Sequence[Any] = ()
) -> IterationView:
    """``held``: offline decodes held out of the batch, which the plan may keep (put back) or park
    again like the running ones. ``shares``: fill in what each running offline request shares with
    other locks (Echo's preemption punishment reads it; HyGen does not, so it is not walked for)."""
    now = time.monotonic()
    running = [
        RunningRequest(
            req.rid,
            not is_offline(req.routing_key),
            _context(req),
            remaining_output(req),
            getattr(req, "blend_arrival", now),
            len(req.output_ids),
            shared_with_others(req) if shares and is_offline(req.routing_key) else 0,
        )
        for req in [*running_batch.reqs, *held]
        if not req.finished()
    ]
    waiting = [
        WaitingOnline(req.rid, _context(req), remaining_output(req), getattr(req, "blend_arrival", now))
        for req in scheduler.waiting_queue
        if not is_offline(req.routing_key)
    ]
    chunked = scheduler.chunked_req
    if chunked is not None and not is_offline(chunked.routing_key):
        waiting.append(
            WaitingOnline(
                chunked.rid,
                len(chunked.origin_input_ids) - chunked.prefix_len,
                remaining_output(chunked),
                getattr(chunked, "blend_arrival", now),
            )
        )
    return IterationView(
        now,
        running,
        waiting,
        int(scheduler.token_to_kv_pool_allocator.size),
        scheduler.chunked_prefill_size,
        parked_tokens,
    )


def release_to_cache(state: ColocationState, req: Any, tree_cache: Any, pin: bool) -> None:
    """Retract a request while keeping every token it has computed in the radix cache; with
    ``pin`` that KV stays out of eviction until the request resumes (`ParkedKV`)."""
    kept = int(req.kv.kv_committed_len)
    sgl.release_kv_cache(req, tree_cache, checkpoint=True)
    state.parked.park(req, tree_cache, kept, pin)
    req.reset_for_retract()
    state.counts["parked"] += 1


def park_running(
    state: ColocationState, scheduler: Any, batch: Any, reqs: list[Any], reason: str, pin: bool = True
) -> None:
    """Take ``reqs`` out of the running batch back to the waiting queue; ``pin`` keeps their
    checkpointed KV resident until they return (`ParkedKV`)."""
    if not reqs:
        return
    chosen = {id(req) for req in reqs}
    keep = [index for index, req in enumerate(batch.reqs) if id(req) not in chosen]
    for req in reqs:
        release_to_cache(state, req, scheduler.tree_cache, pin)
        scheduler._add_request_to_queue(req, is_retracted=True)
    batch.filter_batch(keep_indices=keep)
    batch.batch_is_full = False
    state.counts[reason] += len(reqs)


def hold_running(state: ColocationState, scheduler: Any, batch: Any, rids: set[str]) -> None:
    """Park the offline decodes ``rids`` of the running batch: held with their KV resident; one that
    cannot be held (`held_decodes.holdable`) goes back to the queue with its KV pinned instead."""
    chosen = [req for req in batch.reqs if req.rid in rids]
    held = state.held.hold(scheduler, batch, chosen)
    state.counts["held_for_budget"] += len(held)
    kept = {id(req) for req in held}
    park_running(state, scheduler, batch, [req for req in chosen if id(req) not in kept], "parked_for_budget")


def resume_held(state: ColocationState, scheduler: Any, running_batch: Any, parked: set[str]) -> Any:
    """Put back every held decode the plan does not park; returns the running batch to use."""
    back = [req for req in state.held.requests() if req.rid not in parked]
    return state.held.resume(scheduler, running_batch, back)


def retract_held(state: ColocationState, scheduler: Any, reqs: list[Any], reason: str) -> None:
    """Give back a held request's KV: it leaves the held set for the waiting queue, checkpointed into
    the radix cache without a pin, as a running request preempted for memory does."""
    flying = in_flight(scheduler)
    for req in reqs:
        if not state.held.holds(req) or req.finished() or id(req) in flying:
            continue
        state.held.release(req.rid)
        release_to_cache(state, req, scheduler.tree_cache, pin=False)
        scheduler._add_request_to_queue(req, is_retracted=True)
        state.counts[reason] += 1


def offline_newest_first(batch: Any, exclude: Any = ()) -> list[Any]:
    return [
        req for req in reversed(batch.reqs) if is_offline(req.routing_key) and not req.finished() and req not in exclude
    ]


def add_offline(state: ColocationState, adder: Any, req: Any, has_chunked_req: bool, add: Callable[[], Any]) -> Any:
    """Admit an offline request through SGLang's adder, its chunk capped by the plan."""
    plan = state.plan
    assert plan is not None, "the mode admits through here only under an iteration's plan"
    extend = len(req.full_untruncated_fill_ids) - req.prefix_len
    saved = adder.rem_chunk_tokens
    if has_chunked_req and saved is not None and extend > saved:
        return sgl.AddReqResult.OTHER
    max_new = remaining_output(req)
    chunk = plan.budget.offline_chunk(extend, req.prefix_len, max_new)
    if plan.echo is not None and plan.echo.admit is not None:
        chunk = min(chunk, plan.echo.admit.get(req.rid, 0))
    if chunk <= 0 or (chunk < extend and saved is None):
        state.counts["offline_deferred"] += 1
        return sgl.AddReqResult.OTHER
    result = add_within_chunk(adder, chunk, add)
    if not (adder.can_run_list and adder.can_run_list[-1] is req):
        return result
    truncated = adder.new_chunked_req is req
    plan.budget.commit_offline_prefill(req.extend_end - req.prefix_len, req.prefix_len, not truncated, max_new)
    kept = state.parked.resumed(req.rid)
    if kept is not None:
        state.resumes.append({"rid": req.rid, "kept_tokens": kept, "resumed_prefix": int(req.prefix_len)})
    if truncated:
        adder.rem_chunk_tokens = 0
        return sgl.AddReqResult.OTHER
    return result


def add_online(state: ColocationState, adder: Any, req: Any, add: Callable[[], Any]) -> Any:
    """Admit an online request; if KV is short, take it from running offline work and retry."""
    result = add()
    if result != sgl.AddReqResult.NO_TOKEN or (adder.can_run_list and adder.can_run_list[-1] is req):
        return result
    if _reclaim_memory(state, adder, req):
        result = add()
    return result


def _reclaim_memory(state: ColocationState, adder: Any, req: Any) -> bool:
    need = len(req.full_untruncated_fill_ids) - req.prefix_len + remaining_output(req) - adder.rem_total_tokens
    chosen = []
    for victim in offline_newest_first(adder.running_batch, adder.preempt_list):
        chosen.append(victim)
        need -= adder._get_running_request_total_token_offset(victim) + int(victim.kv.kv_committed_len)
        if need <= 0:
            break
    if not chosen:
        return False
    ids = {id(victim) for victim in chosen}
    for victim in chosen:
        adder.memory_budget.total_offset -= adder._get_running_request_total_token_offset(victim)
        release_to_cache(state, victim, adder.tree_cache, pin=False)
    batch = adder.running_batch
    batch.filter_batch(keep_indices=[i for i, r in enumerate(batch.reqs) if id(r) not in ids])
    adder.preempt_list.extend(chosen)
    state.counts["memory_reclaimed"] += len(chosen)
    return True


def offline_candidates(waiting_queue: list, tree_cache: Any, reusers: ReuserIndex | None) -> list[OfflineCandidate]:
    """The first offline requests of the ordered waiting queue as the selector sees them. Each is
    matched against the radix cache as SGLang's own LPM ordering does (the adder matches again
    when it admits), so ``prefix`` is what is resident now."""
    candidates: list[OfflineCandidate] = []
    for req in waiting_queue:
        if len(candidates) >= CANDIDATE_WINDOW:
            break
        if not is_offline(req.routing_key):
            continue
        sgl.match_kv_cache(req, tree_cache)
        fill = _context(req)
        prefix = min(int(req.prefix_len), fill - 1)
        prompt = req.origin_input_ids
        shared = reusers.reusers(prompt[: min(prefix, len(prompt))]) - 1 if reusers is not None and prefix else 0
        candidates.append(
            OfflineCandidate(
                req.rid,
                fill - prefix,
                prefix,
                remaining_output(req),
                fresh=not req.retraction_count,
                reusers=max(shared, 0),
            )
        )
    return candidates


def select_offline(state: ColocationState, waiting_queue: list, tree_cache: Any, reusers: ReuserIndex | None) -> None:
    """Run Echo's selection on the ordered waiting queue and put its picks first, in its order."""
    plan = state.plan
    assert plan is not None, "the mode selects only under an Echo iteration's plan"
    offline = [req for req in waiting_queue if is_offline(req.routing_key)]
    admit = state.controller.choose_offline(
        plan,
        offline_candidates(waiting_queue, tree_cache, reusers),
        continuing=state.continuing,
        truncate=state.may_truncate,
    )
    if not offline:
        return
    by_rid = {req.rid: req for req in offline}
    online = [req for req in waiting_queue if not is_offline(req.routing_key)]
    waiting_queue[:] = online + [by_rid[rid] for rid in admit] + [req for req in offline if req.rid not in admit]
