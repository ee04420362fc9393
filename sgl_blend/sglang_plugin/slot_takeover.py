"""A real-time (RT) request short of KV takes it from best-effort (BE) requests (BROS §V in SGLang).

Two places find an RT request short of memory: SGLang's prefill adder refusing to admit it
(``NO_TOKEN``), and a decode step that does not fit (``check_decode_mem`` failing, where SGLang
would retract requests and recompute them later). In both the shortfall is measured as SGLang
measures it, the core picks the BE requests that give (`core.bros.takeover.plan_takeover`: held
ones first, then running ones, the most slots first), a running one is held back first
(`held_decodes`) -- which may be enough by itself, since a held request reserves nothing for its
future tokens and needs no slot this step -- and only the slots still wanted are checkpointed to
host (`kv_checkpoint`). SGLang's adder and decode check then decide as they always do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sgl_blend.core.bros.takeover import plan_takeover
from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.held_decodes import HeldDecodes, holdable, resident_tokens
from sgl_blend.sglang_plugin.kv_checkpoint import KVCheckpoint


def admission_shortfall(adder: Any, req: Any) -> int:
    """How many more free KV slots SGLang's adder needs to admit ``req`` now (<= 0: memory is not
    what stops it). Mirrors SGLang 0.5.23's ``PrefillAdder.add_one_req`` (``extend + max_new +
    page < remaining total``) and, for ``ignore_eos`` requests without a radix cache,
    ``add_one_req_ignore_eos`` (the new prefill fits now, and every request -- this one, the
    running ones, those admitted this pass -- can still run to its last token when the shortest
    ones finish first, with one spare token each). Always a whole number of slots."""
    extend = len(req.full_untruncated_fill_ids) - req.prefix_len
    if not (req.sampling_params.ignore_eos and getattr(adder.tree_cache, "disable", True)):
        max_new = min(max(req.sampling_params.max_new_tokens - len(req.output_ids), 0), sgl.CLIP_MAX_NEW_TOKENS)
        total = extend + max_new + adder.per_req_token_overhead
        return math.floor(total - adder.rem_total_tokens) + 1
    paged = adder.ceil_paged_tokens(extend) + adder.per_req_token_overhead
    current = adder.cur_rem_tokens
    # Whole slots: SGLang's remaining total is fractional once running requests reserve their
    # future tokens at its new-token ratio, and a fractional count cannot index KV slots.
    need = math.ceil(paged - min(current, adder.rem_total_tokens))
    states = sorted(
        (
            state
            for other in [req, *adder.running_batch.reqs, *adder.can_run_list]
            if (state := _decode_state(adder, other)) is not None
        ),
        key=lambda state: state[0],
    )
    freed = 0
    for index, (left, occupied) in enumerate(states):
        running = len(states) - index
        reserve = sgl.IGNORE_EOS_RESERVE_TOKENS * running
        need = max(need, math.floor(left * running + reserve - (current - paged) - freed) + 1)
        freed += occupied
    return need


def _decode_state(adder: Any, req: Any) -> tuple[float, int] | None:
    """(tokens still to decode, tokens in its KV) as ``add_one_req_ignore_eos`` counts them."""
    ratio = 1.0 if req.sampling_params.ignore_eos else adder.new_token_ratio
    left = req.sampling_params.max_new_tokens * ratio - len(req.output_ids)
    return (left, len(req.origin_input_ids) + len(req.output_ids)) if left > 0 else None


class SlotTakeover:
    def __init__(self, held: HeldDecodes, checkpoint: KVCheckpoint, best_effort: Callable[[Any], bool]) -> None:
        self.held = held
        self.checkpoint = checkpoint
        self.best_effort = best_effort
        self.counts = {"admission_takeovers": 0, "decode_takeovers": 0, "held_for_memory": 0}

    def admit(self, scheduler: Any, adder: Any, req: Any, add: Callable[[], Any]) -> Any:
        """Admit the RT request ``req`` through SGLang's adder (``add``); while the adder says the
        KV pool is short, make room from BE requests and ask again."""
        result = add()
        made_room = False
        while result == sgl.AddReqResult.NO_TOKEN and not _admitted(adder, req):
            need = admission_shortfall(adder, req)
            if need <= 0 or not self._make_room(
                scheduler,
                adder.running_batch,
                need,
                lambda: admission_shortfall(adder, req),
                lambda r: _unreserve(adder, r),
            ):
                break
            made_room = True
            adder.req_states = None
            result = add()
        self.counts["admission_takeovers"] += made_room
        return result

    def decode(self, scheduler: Any, batch: Any) -> None:
        """Before SGLang decodes ``batch``: if the step does not fit and an RT request is in it,
        make room from BE requests instead of letting SGLang retract."""
        if batch.check_decode_mem() or all(self.best_effort(req) for req in batch.reqs):
            return
        allocator = scheduler.token_to_kv_pool_allocator

        def shortfall() -> int:
            return int(batch.new_tokens_required_next_decode() - allocator.available_size())

        self.counts["decode_takeovers"] += self._make_room(scheduler, batch, shortfall(), shortfall)

    def _make_room(
        self,
        scheduler: Any,
        running_batch: Any,
        need: int,
        shortfall: Callable[[], int],
        on_hold: Callable[[Any], None] | None = None,
    ) -> bool:
        """Hold and checkpoint BE requests, as the core chooses, until ``shortfall`` is met or
        nothing is left to take; returns whether anything changed."""
        held = {
            req.rid: resident_tokens(req)
            for req in self.held.requests()
            if self.best_effort(req) and not req.finished()
        }
        running = {
            req.rid: resident_tokens(req)
            for req in running_batch.reqs
            if self.best_effort(req) and holdable(scheduler, req)
        }
        by_rid = {req.rid: req for req in running_batch.reqs}
        changed = False
        for take in plan_takeover(need, held, running):
            if take.running:
                victim = by_rid[take.rid]
                if on_hold is not None:
                    on_hold(victim)
                self.held.hold(scheduler, running_batch, [victim])
                self.counts["held_for_memory"] += 1
                changed = True
                need = shortfall()
                if need <= 0:
                    break
            else:
                victim = self.held.get(take.rid)
            changed |= self.checkpoint.take(scheduler, victim, min(take.tokens, need)) > 0
            need = shortfall()
            if need <= 0:
                break
        return changed


def _admitted(adder: Any, req: Any) -> bool:
    return bool(adder.can_run_list) and adder.can_run_list[-1] is req


def _unreserve(adder: Any, req: Any) -> None:
    """A running request leaves the batch: the adder stops reserving its future tokens, as SGLang's
    ``preempt_to_schedule`` does for a request it preempts."""
    adder.memory_budget.total_offset -= adder._get_running_request_total_token_offset(req)
