"""Co-location plans carried out with SGLang's own mechanisms: scheduler state in, `core.colocation` plans out.

- the view: the scheduler's running batch and waiting queue become an `IterationView`;
- parking: an offline decode the plan skips, or one whose memory an online request needs, is
  released with its KV checkpointed into the radix cache (prompt and generated tokens alike), and
  goes back to the waiting queue; it resumes from that cache with a one-token prefill;
- offline prefill: the prefill adder caps each offline chunk at what the plan's budget allows
  and makes a truncated offline chunk the pass's last admission (SGLang tracks one chunked
  request at a time);
- online admission: an online request short of KV takes it from running offline work.

Nothing here decides; it only translates. `ColocationState` is what the mode keeps between calls.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any, Callable

from sgl_blend.core.colocation import (
    ColocationConfig, ColocationController, IterationPlan, IterationView, RunningRequest, WaitingOnline,
)
from sgl_blend.offline import is_offline

KEPT_RESUMES = 256


class ColocationState:
    def __init__(self, config: ColocationConfig) -> None:
        self.controller = ColocationController(config)
        self.plan: IterationPlan | None = None
        self.counts: Counter[str] = Counter()
        self.parked: dict[str, int] = {}
        self.resumes: deque[dict[str, Any]] = deque(maxlen=KEPT_RESUMES)

    def snapshot(self) -> dict[str, Any]:
        config = self.controller.config
        return {"mode": config.mode, "latency_budget_s": config.latency_budget_s,
                "latency_model": (config.latency_model or {}).get("form"),
                "calibration": round(self.controller.calibration, 4), "counts": dict(self.counts),
                "parked_now": len(self.parked), "resumes": list(self.resumes)}


def remaining_output(req: Any) -> int:
    return max(int(req.sampling_params.max_new_tokens) - len(req.output_ids), 0)


def _context(req: Any) -> int:
    return len(req.origin_input_ids) + len(req.output_ids)


def iteration_view(scheduler: Any, running_batch: Any) -> IterationView:
    now = time.monotonic()
    running = [RunningRequest(req.rid, not is_offline(req.routing_key), _context(req), remaining_output(req),
                              getattr(req, "blend_arrival", now), len(req.output_ids))
               for req in running_batch.reqs if not req.finished()]
    waiting = [WaitingOnline(req.rid, _context(req), remaining_output(req), getattr(req, "blend_arrival", now))
               for req in scheduler.waiting_queue if not is_offline(req.routing_key)]
    chunked = scheduler.chunked_req
    if chunked is not None and not is_offline(chunked.routing_key):
        waiting.append(WaitingOnline(chunked.rid, len(chunked.origin_input_ids) - chunked.prefix_len,
                                     remaining_output(chunked), getattr(chunked, "blend_arrival", now)))
    return IterationView(now, running, waiting, int(scheduler.token_to_kv_pool_allocator.size),
                         scheduler.chunked_prefill_size)


def release_to_cache(state: ColocationState, req: Any, tree_cache: Any) -> None:
    """Retract a request while keeping every token it has computed in the radix cache."""
    from sglang.srt.mem_cache.common import release_kv_cache

    kept = int(req.kv.kv_committed_len)
    release_kv_cache(req, tree_cache, checkpoint=True)
    req.reset_for_retract()
    state.parked[req.rid] = kept
    state.counts["parked"] += 1


def park_running(state: ColocationState, scheduler: Any, batch: Any, reqs: list[Any], reason: str) -> None:
    if not reqs:
        return
    chosen = {id(req) for req in reqs}
    keep = [index for index, req in enumerate(batch.reqs) if id(req) not in chosen]
    for req in reqs:
        release_to_cache(state, req, scheduler.tree_cache)
        scheduler._add_request_to_queue(req, is_retracted=True)
    batch.filter_batch(keep_indices=keep)
    batch.batch_is_full = False
    state.counts[reason] += len(reqs)


def offline_newest_first(batch: Any, exclude: Any = ()) -> list[Any]:
    return [req for req in reversed(batch.reqs)
            if is_offline(req.routing_key) and not req.finished() and req not in exclude]


def add_offline(state: ColocationState, adder: Any, req: Any, has_chunked_req: bool, add: Callable[[], Any]) -> Any:
    """Admit an offline request through SGLang's adder, its chunk capped by the plan."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    plan = state.plan
    extend = len(req.full_untruncated_fill_ids) - req.prefix_len
    saved = adder.rem_chunk_tokens
    if has_chunked_req and saved is not None and extend > saved:
        return AddReqResult.OTHER
    max_new = remaining_output(req)
    chunk = plan.budget.offline_chunk(extend, req.prefix_len, max_new)
    if chunk <= 0 or (chunk < extend and saved is None):
        state.counts["offline_deferred"] += 1
        return AddReqResult.OTHER
    if saved is not None:
        adder.rem_chunk_tokens = min(saved, chunk)
    capped = adder.rem_chunk_tokens
    result = add()
    if saved is not None:
        # SGLang judged "budget left?" against the cap; judge it again against the real room.
        adder.rem_chunk_tokens = saved - (capped - adder.rem_chunk_tokens)
        if result != AddReqResult.NO_TOKEN:
            result = adder.budget_state()
    if not (adder.can_run_list and adder.can_run_list[-1] is req):
        return result
    truncated = adder.new_chunked_req is req
    plan.budget.commit_offline_prefill(req.extend_end - req.prefix_len, req.prefix_len, not truncated, max_new)
    kept = state.parked.pop(req.rid, None)
    if kept is not None:
        state.resumes.append({"rid": req.rid, "kept_tokens": kept, "resumed_prefix": int(req.prefix_len)})
    if truncated:
        adder.rem_chunk_tokens = 0
        return AddReqResult.OTHER
    return result


def add_online(state: ColocationState, adder: Any, req: Any, add: Callable[[], Any]) -> Any:
    """Admit an online request; if KV is short, take it from running offline work and retry."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    result = add()
    if result != AddReqResult.NO_TOKEN or (adder.can_run_list and adder.can_run_list[-1] is req):
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
        release_to_cache(state, victim, adder.tree_cache)
    batch = adder.running_batch
    batch.filter_batch(keep_indices=[i for i, r in enumerate(batch.reqs) if id(r) not in ids])
    adder.preempt_list.extend(chosen)
    state.counts["memory_reclaimed"] += len(chosen)
    return True
