"""Hooks that put sgl-blend into SGLang's scheduler through its own extension points.

- An AROUND hook on ``SchedulePolicy.calc_priority`` lets SGLang order the waiting queue as it
  always does, then moves online requests first and offline requests into the policy's order.
- A REPLACE hook on ``Scheduler.get_prefill_adder_class`` returns a `PrefillAdder` subclass that
  stops at the first offline request the policy did not propose (the queue is ordered so that
  every request behind it is unproposed offline work too) and, in a co-location mode, caps
  offline chunks and lets online requests reclaim memory from offline ones.
- AROUND hooks on ``Scheduler._get_new_batch_prefill_raw`` and ``Scheduler.update_running_batch``
  apply the co-location plan before SGLang builds a prefill or a decode batch.
- An AROUND hook on ``Scheduler.run_batch`` keeps the per-iteration record; an AFTER hook on
  ``process_batch_result`` reports progress and completions to the offline pool.
- An AFTER hook on ``Scheduler._add_request_to_queue`` notes when online requests arrive.
- An AFTER hook on the internal-state controller's update handlers accepts ``sgl_blend_*``
  settings through ``POST /set_internal_state`` (the SLO profiler moves the budget this way).

The pool lives in the scheduler process and is created on first use, from the environment that
`sgl-blend serve` passes down (``SGLBLEND_OFFLINE_POLICY``, ``SGLBLEND_HARDWARE``,
``SGLBLEND_COLOCATION``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from sgl_blend.core.prefill_room import prefill_room
from sgl_blend.offline import is_offline
from sgl_blend.sglang_plugin import bros_hooks
from sgl_blend.sglang_plugin import colocation_hooks as colocation
from sgl_blend.sglang_plugin.guard import guard
from sgl_blend.sglang_plugin.iteration_log import IterationRecorder
from sgl_blend.sglang_plugin.offline_pool import OfflinePool

if TYPE_CHECKING:
    from sgl_blend.core.cost_model import HardwareSpec

POLICY_ENV = "SGLBLEND_OFFLINE_POLICY"
HARDWARE_ENV = "SGLBLEND_HARDWARE"
UTILITY_ENV = "SGLBLEND_PSM_UTILITY"
RECORD_CALLS_ENV = "SGLBLEND_RECORD_POLICY_CALLS"
DEFAULT_POLICY = "blendserve"
DEFAULT_HARDWARE = "a100-80g"
CPU_HARDWARE = "cpu"
OFF = "off"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
STATE_KEY = "sgl_blend"

logger = logging.getLogger(__name__)
_pool: OfflinePool | None = None
_failed = False
_recorder: IterationRecorder | None = None


def active_pool() -> OfflinePool | None:
    return _pool


def active_recorder() -> IterationRecorder | None:
    return _recorder


def reset_records() -> None:
    global _recorder
    if _recorder is not None:
        _recorder = IterationRecorder.from_env()


def _drop_pool() -> None:
    global _pool, _failed
    _pool, _failed = None, True


def _stop_recording() -> None:
    global _recorder
    _recorder = None


_guarded = guard(lambda: _pool, _drop_pool,
                 "sgl-blend offline pool failed; falling back to SGLang's own scheduling")
_recording = guard(lambda: _recorder, _stop_recording, "sgl-blend per-iteration record failed; recording stops")


def _free_kv_tokens(tree_cache: Any) -> int:
    return int(tree_cache.token_to_kv_pool_allocator.available_size() + tree_cache.evictable_size())


def _create_pool(tree_cache: Any) -> OfflinePool | None:
    name = os.environ.get(POLICY_ENV, DEFAULT_POLICY)
    if name == OFF:
        return None
    from sglang.srt.runtime_context import get_server_args

    from sgl_blend.core.cost_model import ModelSpec
    from sgl_blend.core.kv_priority import ReuserIndex
    from sgl_blend.core.psm_policy import PSMPolicy, make_offline_policy

    server_args = get_server_args()
    model = ModelSpec.from_hf_dir(server_args.model_path)
    hardware = configured_hardware(server_args.tp_size)
    capacity = int(tree_cache.token_to_kv_pool_allocator.size)
    options = {"utility": float(os.environ[UTILITY_ENV])} if name == PSMPolicy.name and UTILITY_ENV in os.environ else {}
    state = colocation.active_colocation()
    reusers = ReuserIndex() if state is not None and state.controller.config.kv_priorities else None
    return OfflinePool(make_offline_policy(name, model, hardware, **options), name, capacity, reusers,
                       record_calls=os.environ.get(RECORD_CALLS_ENV) == "1")


def configured_hardware(tp_size: int = 1, name: str | None = None) -> HardwareSpec:
    """The device ``name`` (by default the one `sgl-blend serve --hardware` passed down as
    ``SGLBLEND_HARDWARE``) as one scheduler sees it: a TP group of ``tp_size`` devices has that
    many times the compute, bandwidth and KV memory of one. Without CUDA the default is the
    measured ``cpu`` profile, whose overlap makes BlendServe order by prefix with one cursor."""
    from sgl_blend.core.cost_model import HardwareSpec

    from sgl_blend.launch.cpu_compat import cuda_present

    default = DEFAULT_HARDWARE if cuda_present() else CPU_HARDWARE
    return HardwareSpec.resolve(name or os.environ.get(HARDWARE_ENV, default)).scaled(tp_size)


def _calc_priority(original: Callable, policy: Any, waiting_queue: list, *args: Any, **kwargs: Any) -> Any:
    global _pool, _failed
    result = original(policy, waiting_queue, *args, **kwargs)
    if _pool is None and not _failed and os.environ.get(POLICY_ENV, DEFAULT_POLICY) != OFF:
        try:
            _pool = _create_pool(policy.tree_cache)
        except Exception:
            logger.exception("sgl-blend could not create its offline pool; SGLang schedules on its own")
            _failed = True
    _order(waiting_queue, policy.tree_cache)
    return result


@_guarded
def _order(waiting_queue: list, tree_cache: Any) -> None:
    _pool.order_waiting_queue(waiting_queue, _free_kv_tokens(tree_cache))


@_guarded
def _report_batch(reqs: list) -> None:
    _pool.on_batch_result(reqs)


def _may_admit(req: Any) -> bool | None:
    planned = bros_hooks.may_admit(req)
    return planned if planned is not None else _pool_may_admit(req)


@_guarded
def _pool_may_admit(req: Any) -> bool:
    return _pool.may_admit(req)


@_guarded
def _cap_prefill(adder: Any, chunk: int | None, decodes: int) -> None:
    """Apply the policy's per-iteration prefill budget (Alg. 3's ``C_L + C_R``) to SGLang's
    chunk, by the rule the simulator uses (`prefill_room`)."""
    budget = _pool.prefill_budget()
    if chunk is not None and budget is not None and adder.rem_chunk_tokens > 0:
        adder.rem_chunk_tokens = prefill_room(chunk, decodes, budget)
        adder.rem_input_tokens = min(adder.rem_input_tokens, adder.rem_chunk_tokens)
    _pool.prefill_cap = adder.rem_chunk_tokens


@_guarded
def _admitted(req: Any, tree_cache: Any) -> None:
    _pool.on_admitted(req, tree_cache)


@_recording
def _record_arrival(scheduler: Any, req: Any) -> None:
    _recorder.arrived(req.rid, int(scheduler.forward_ct))


@_recording
def _record_plan(summary: dict[str, Any] | None) -> None:
    _recorder.plan_summary = summary or {}


@_recording
def _record_begin(scheduler: Any, batch: Any) -> None:
    _recorder.begin(batch, int(scheduler.forward_ct) + 1)


@_recording
def _record_forward() -> dict[str, Any] | None:
    return _recorder.forward_done()


def _after_add_to_queue(result: Any, scheduler: Any, req: Any, is_retracted: bool = False, *_args: Any,
                        **_kwargs: Any) -> Any:
    if not is_retracted and not is_offline(req.routing_key):
        colocation.note_arrival(req)
        _record_arrival(scheduler, req)
    if not is_retracted:
        bros_hooks.note_arrival(scheduler, req)
    return result


def _around_prefill(original: Callable, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    running_batch = kwargs["running_batch"] if "running_batch" in kwargs else args[-1]
    colocation.before_prefill(scheduler, running_batch)
    bros_hooks.before_prefill(scheduler, running_batch)
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        _record_plan(colocation.end_iteration())
        bros_hooks.end_iteration()


def _around_decode(original: Callable, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    colocation.before_decode(scheduler, batch)
    try:
        return original(scheduler, batch, *args, **kwargs)
    finally:
        _record_plan(colocation.end_iteration())


def _around_run_batch(original: Callable, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    _record_begin(scheduler, batch)
    started = time.monotonic()
    result = original(scheduler, batch, *args, **kwargs)
    bros_hooks.forward_done(time.monotonic() - started)
    colocation.observe_batch(_record_forward())
    return result


def _after_batch_result(result: Any, _scheduler: Any, batch: Any, *_args: Any, **_kwargs: Any) -> Any:
    if batch is not None:
        _report_batch(batch.reqs)
        bros_hooks.observe(batch)
    return result


def _with_update_handlers(handlers: dict, *_args: Any, **_kwargs: Any) -> dict:
    from sglang.srt.managers.scheduler_components.internal_state import _UpdateHandler

    for key, (validate, apply) in colocation.update_handlers(colocation.current_config).items():
        handlers[key] = _UpdateHandler(validate, apply)
    return handlers


def _blend_prefill_adder_class() -> type:
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    class BlendPrefillAdder(PrefillAdder):
        """SGLang's adder, admitting offline work only in the order the policy proposed and, when
        co-locating, only within the iteration's plan; its prefill room is the policy's."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            chunk = args[6] if len(args) > 6 else kwargs.get("rem_chunk_tokens")
            decodes = args[7] if len(args) > 7 else kwargs.get("num_mixed_decode_tokens", 0)
            _cap_prefill(self, chunk, decodes)

        def add_chunked_req(self, req: Any) -> Any:
            limit = colocation.chunked_limit(req)
            if limit is not None:
                self.chunked_req_limit = limit if self.chunked_req_limit is None else min(self.chunked_req_limit, limit)
            result = super().add_chunked_req(req)
            colocation.after_chunked(self, req, result is not None)
            return result

        def add_one_req(self, req: Any, has_chunked_req: bool, truncation_align_size: Any) -> Any:
            if _may_admit(req) is False:
                return AddReqResult.OTHER

            def add() -> Any:
                return super(BlendPrefillAdder, self).add_one_req(req, has_chunked_req, truncation_align_size)

            if colocation.current_plan() is None:
                result = add()
            else:
                result = self._add_colocated(req, has_chunked_req, add)
            if self.can_run_list and self.can_run_list[-1] is req:
                _admitted(req, self.tree_cache)
            return result

        def _add_colocated(self, req: Any, has_chunked_req: bool, add: Callable[[], Any]) -> Any:
            try:
                if is_offline(req.routing_key):
                    return colocation.add_offline(self, req, has_chunked_req, add)
                return colocation.add_online(self, req, add)
            except Exception:
                logger.exception("sgl-blend co-location failed; falling back to SGLang's own scheduling")
                colocation.disable_after_error()
                return self.budget_state() if self.can_run_list and self.can_run_list[-1] is req else add()

    return BlendPrefillAdder


def register_scheduler_hooks() -> None:
    global _recorder
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _recorder = IterationRecorder.from_env()
    colocation.start_from_env()
    adder_class: list[type] = []

    def prefill_adder_class(_scheduler: Any) -> type:
        if not adder_class:
            adder_class.append(_blend_prefill_adder_class())
        return adder_class[0]

    HookRegistry.register(
        "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority", _calc_priority, HookType.AROUND
    )
    HookRegistry.register(f"{SCHEDULER}.get_prefill_adder_class", prefill_adder_class, HookType.REPLACE)
    HookRegistry.register(f"{SCHEDULER}._get_new_batch_prefill_raw", _around_prefill, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.update_running_batch", _around_decode, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.run_batch", _around_run_batch, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.process_batch_result", _after_batch_result, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}._add_request_to_queue", _after_add_to_queue, HookType.AFTER)
    HookRegistry.register(
        "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController._update_handlers",
        _with_update_handlers, HookType.AFTER,
    )
