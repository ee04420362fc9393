"""Co-location inside SGLang's scheduler: scheduler state in, `core.colocation` plans out.

Each iteration, before SGLang builds a batch, the plugin turns the scheduler's running batch and
waiting queue into an `IterationView`, asks the `ColocationController` for a plan, and applies
it with SGLang's own mechanisms:

- online first: when online requests wait, an offline chunked prefill in flight gives up the
  chunk slot, the "batch is full" latch is reset, and offline decodes give up request slots;
- parking: an offline decode the plan skips, or one whose memory an online request needs, is
  released with its KV checkpointed into the radix cache (prompt and generated tokens alike), and
  goes back to the waiting queue; it resumes from that cache with a one-token prefill;
- offline prefill: the prefill adder caps each offline chunk at what the plan's budget allows
  and makes a truncated offline chunk the pass's last admission (SGLang tracks one chunked
  request at a time).

The plan itself lives in `core.colocation`; nothing here decides, it only translates. A failure
disables co-location (logged once) and SGLang schedules on its own from then on.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from typing import Any, Callable

from sgl_blend.core.colocation import (
    ColocationConfig, ColocationController, IterationPlan, IterationView, RunningRequest, WaitingOnline,
)
from sgl_blend.offline import is_offline
from sgl_blend.sglang_plugin.guard import guard

logger = logging.getLogger(__name__)
KEPT_RESUMES = 256
SETTING_PREFIX = "sgl_blend_"
RESET_RECORDS = "reset_records"
CLEAR_BUDGET = "clear_latency_budget"
NUMERIC_SETTINGS = ("latency_budget_s", "ttft_slo_s", "tpot_slo_s", "idle_budget_s", "reserve_sigmas",
                    "reserve_window_s", "min_offline_chunk", "calibration_alpha")


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


_state: ColocationState | None = None


def active_colocation() -> ColocationState | None:
    return _state


def start_from_env() -> None:
    global _state
    try:
        config = ColocationConfig.from_env()
    except ValueError:
        logger.exception("sgl-blend co-location settings are invalid; SGLang schedules on its own")
        return
    if config.mode == "bros":
        from sgl_blend.sglang_plugin import bros_hooks

        bros_hooks.configure(config)
        _state = None
        return
    _state = ColocationState(config) if config.enabled else None


def disable_after_error() -> None:
    global _state
    _state = None


def guarded(fallback: Any = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run a step only while co-location is active; on error disable it and return ``fallback``."""
    return guard(lambda: _state, disable_after_error,
                 "sgl-blend co-location failed; falling back to SGLang's own scheduling", fallback)


def _remaining_output(req: Any) -> int:
    return max(int(req.sampling_params.max_new_tokens) - len(req.output_ids), 0)


def _context(req: Any) -> int:
    return len(req.origin_input_ids) + len(req.output_ids)


def iteration_view(scheduler: Any, running_batch: Any) -> IterationView:
    now = time.monotonic()
    running = [RunningRequest(req.rid, not is_offline(req.routing_key), _context(req), _remaining_output(req),
                              getattr(req, "blend_arrival", now), len(req.output_ids))
               for req in running_batch.reqs if not req.finished()]
    waiting = [WaitingOnline(req.rid, _context(req), _remaining_output(req), getattr(req, "blend_arrival", now))
               for req in scheduler.waiting_queue if not is_offline(req.routing_key)]
    chunked = scheduler.chunked_req
    if chunked is not None and not is_offline(chunked.routing_key):
        waiting.append(WaitingOnline(chunked.rid, len(chunked.origin_input_ids) - chunked.prefix_len,
                                     _remaining_output(chunked), getattr(chunked, "blend_arrival", now)))
    return IterationView(now, running, waiting, int(scheduler.token_to_kv_pool_allocator.size),
                         scheduler.chunked_prefill_size)


def note_arrival(req: Any) -> None:
    """When a request first entered the scheduler; Echo's deadlines count from it."""
    if not hasattr(req, "blend_arrival"):
        req.blend_arrival = time.monotonic()


def release_to_cache(req: Any, tree_cache: Any) -> None:
    """Retract a request while keeping every token it has computed in the radix cache."""
    from sglang.srt.mem_cache.common import release_kv_cache

    kept = int(req.kv.kv_committed_len)
    release_kv_cache(req, tree_cache, checkpoint=True)
    req.reset_for_retract()
    _state.parked[req.rid] = kept
    _state.counts["parked"] += 1


def _park_running(scheduler: Any, batch: Any, reqs: list[Any], reason: str) -> None:
    if not reqs:
        return
    chosen = {id(req) for req in reqs}
    keep = [index for index, req in enumerate(batch.reqs) if id(req) not in chosen]
    for req in reqs:
        release_to_cache(req, scheduler.tree_cache)
        scheduler._add_request_to_queue(req, is_retracted=True)
    batch.filter_batch(keep_indices=keep)
    batch.batch_is_full = False
    _state.counts[reason] += len(reqs)


def _offline_newest_first(batch: Any, exclude: Any = ()) -> list[Any]:
    return [req for req in reversed(batch.reqs)
            if is_offline(req.routing_key) and not req.finished() and req not in exclude]


def _plan(scheduler: Any, batch: Any) -> IterationPlan:
    plan = _state.controller.begin(iteration_view(scheduler, batch))
    parked = set(plan.park)
    _park_running(scheduler, batch, [req for req in batch.reqs if req.rid in parked], "parked_for_budget")
    _state.plan = plan
    return plan


@guarded()
def before_prefill(scheduler: Any, running_batch: Any) -> None:
    """Online first, then the iteration's plan."""
    waiting_online = sum(1 for req in scheduler.waiting_queue if not is_offline(req.routing_key))
    if waiting_online:
        chunked = scheduler.chunked_req
        if chunked is not None and is_offline(chunked.routing_key):
            release_to_cache(chunked, scheduler.tree_cache)
            scheduler.chunked_req = None
            scheduler._add_request_to_queue(chunked, is_retracted=True)
            _state.counts["chunk_slot_reclaimed"] += 1
        running_batch.batch_is_full = False
        slots = scheduler.get_num_allocatable_reqs(len(running_batch.reqs), running_batch=running_batch)
        short = waiting_online - slots
        if short > 0:
            _park_running(scheduler, running_batch, _offline_newest_first(running_batch)[:short], "slots_reclaimed")
    _plan(scheduler, running_batch)


@guarded()
def before_decode(scheduler: Any, batch: Any) -> None:
    """The decode iteration's plan; offline decodes give way first when KV runs out."""
    _plan(scheduler, batch)
    while not batch.check_decode_mem():
        victims = _offline_newest_first(batch)
        if not victims or len(batch.reqs) == 1:
            break
        _park_running(scheduler, batch, victims[:1], "memory_reclaimed")


def end_iteration() -> dict[str, Any] | None:
    """Drop the plan once SGLang has built its batch; returns what it spent, for the record."""
    if _state is None or _state.plan is None:
        return None
    plan, _state.plan = _state.plan, None
    return plan.summary()


@guarded()
def observe_batch(record: dict[str, Any] | None) -> None:
    """Teach the calibration what the batch it planned really cost."""
    if record is not None:
        _state.controller.observe(record.get("model_s"), record.get("forward_s"))


@guarded()
def current_plan() -> IterationPlan | None:
    return _state.plan


@guarded()
def chunked_limit(req: Any) -> int | None:
    """The chunk an offline chunked prefill under way may run now (at least a minimal one)."""
    plan = _state.plan
    if plan is None or not is_offline(req.routing_key):
        return None
    remaining = len(req.full_untruncated_fill_ids) - req.prefix_len
    return plan.budget.offline_chunk(remaining, req.prefix_len, _remaining_output(req), must_progress=True)


@guarded()
def after_chunked(adder: Any, req: Any, still_chunked: bool) -> None:
    plan = _state.plan
    if plan is None or not is_offline(req.routing_key) or not (adder.can_run_list and adder.can_run_list[-1] is req):
        return
    plan.budget.commit_offline_prefill(req.extend_end - req.prefix_len, req.prefix_len, not still_chunked,
                                       _remaining_output(req))
    if still_chunked:
        adder.rem_chunk_tokens = 0


def add_offline(adder: Any, req: Any, has_chunked_req: bool, add: Callable[[], Any]) -> Any:
    """Admit an offline request through SGLang's adder, its chunk capped by the plan."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    plan = _state.plan
    extend = len(req.full_untruncated_fill_ids) - req.prefix_len
    saved = adder.rem_chunk_tokens
    if has_chunked_req and saved is not None and extend > saved:
        return AddReqResult.OTHER
    max_new = _remaining_output(req)
    chunk = plan.budget.offline_chunk(extend, req.prefix_len, max_new)
    if chunk <= 0 or (chunk < extend and saved is None):
        _state.counts["offline_deferred"] += 1
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
    kept = _state.parked.pop(req.rid, None)
    if kept is not None:
        _state.resumes.append({"rid": req.rid, "kept_tokens": kept, "resumed_prefix": int(req.prefix_len)})
    if truncated:
        adder.rem_chunk_tokens = 0
        return AddReqResult.OTHER
    return result


def add_online(adder: Any, req: Any, add: Callable[[], Any]) -> Any:
    """Admit an online request; if KV is short, take it from running offline work and retry."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    result = add()
    if result != AddReqResult.NO_TOKEN or (adder.can_run_list and adder.can_run_list[-1] is req):
        return result
    if _reclaim_memory(adder, req):
        result = add()
    return result


def _reclaim_memory(adder: Any, req: Any) -> bool:
    need = len(req.full_untruncated_fill_ids) - req.prefix_len + _remaining_output(req) - adder.rem_total_tokens
    chosen = []
    for victim in _offline_newest_first(adder.running_batch, adder.preempt_list):
        chosen.append(victim)
        need -= adder._get_running_request_total_token_offset(victim) + int(victim.kv.kv_committed_len)
        if need <= 0:
            break
    if not chosen:
        return False
    ids = {id(victim) for victim in chosen}
    for victim in chosen:
        adder.memory_budget.total_offset -= adder._get_running_request_total_token_offset(victim)
        release_to_cache(victim, adder.tree_cache)
    batch = adder.running_batch
    batch.filter_batch(keep_indices=[i for i, r in enumerate(batch.reqs) if id(r) not in ids])
    adder.preempt_list.extend(chosen)
    _state.counts["memory_reclaimed"] += len(chosen)
    return True


def update_handlers(current: Callable[[], ColocationConfig]) -> dict[str, tuple[Callable, Callable]]:
    """Validate/apply pairs for ``POST /set_internal_state {"server_args": {...}}``. SGLang takes only
    numbers there, so each numeric `ColocationConfig` field is a key of its own
    (``sgl_blend_latency_budget_s``), ``sgl_blend_clear_latency_budget: 1`` removes the budget and
    ``sgl_blend_reset_records: 1`` clears the per-iteration record. The mode and the latency model
    are launch settings."""
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected

    def change(key: str, value: Any) -> dict[str, Any]:
        field = key[len(SETTING_PREFIX):]
        if field == CLEAR_BUDGET:
            return {"latency_budget_s": None}
        return {field: int(value) if field == "min_offline_chunk" else float(value)}

    def validate(key: str, value: Any) -> None:
        try:
            current().updated(change(key, value))
        except (TypeError, ValueError) as error:
            raise UpdateRejected(f"{key}: {error}") from None

    def apply(key: str, value: Any) -> None:
        global _state
        config = current().updated(change(key, value))
        if _state is not None:
            _state.controller.reconfigure(change(key, value))
        elif config.enabled:
            _state = ColocationState(config)
        logger.info("sgl-blend co-location now %s", config.to_json())

    def reset(_key: str, _value: Any) -> None:
        from sgl_blend.sglang_plugin.scheduler_hooks import reset_records

        reset_records()

    handlers = {SETTING_PREFIX + field: (validate, apply) for field in (*NUMERIC_SETTINGS, CLEAR_BUDGET)}
    handlers[SETTING_PREFIX + RESET_RECORDS] = (lambda _key, _value: None, reset)
    return handlers


def current_config() -> ColocationConfig:
    return _state.controller.config if _state is not None else ColocationConfig.from_env()
