"""Where the plugin enters SGLang's scheduler: `HookRegistry` hooks, each a thin call into the runtime.

- An AROUND hook on ``SchedulePolicy.calc_priority`` lets SGLang order the waiting queue as it
  always does, then moves online requests first and offline requests into the policy's order.
- A REPLACE hook on ``Scheduler.get_prefill_adder_class`` returns the plugin's `PrefillAdder`
  subclass (`prefill_adder`).
- AROUND hooks on ``Scheduler._get_new_batch_prefill_raw`` and ``Scheduler.update_running_batch``
  let the mode plan before SGLang builds a prefill or a decode batch, and drop the plan after;
  the prefill hook passes on the running batch the mode returns (held decodes put back).
- An AROUND hook on ``Scheduler.is_fully_idle`` keeps SGLang busy while the mode holds decodes
  out of the running batch (an idle scheduler checks its KV pool for leaks and sleeps), and an
  AFTER hook on ``Scheduler.abort_request`` frees held decodes, which SGLang's abort cannot see.
- An AROUND hook on ``Scheduler.run_batch`` keeps the per-iteration record and times the forward;
  an AFTER hook on ``process_batch_result`` reports progress and completions.
- An AFTER hook on ``Scheduler._add_request_to_queue`` notes when requests first arrive.
- The internal-state controller's hooks live in `internal_state`.

The hooks only translate SGLang's call signatures; what they act on is the `PluginRuntime`.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from sgl_blend.sglang_plugin.internal_state import register_internal_state_hooks
from sgl_blend.sglang_plugin.prefill_adder import prefill_adder_hook
from sgl_blend.sglang_plugin.runtime import PluginRuntime

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
CALC_PRIORITY = "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority"


def register_hooks(runtime: PluginRuntime) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def calc_priority(original: Callable, policy: Any, waiting_queue: list, *args: Any, **kwargs: Any) -> Any:
        result = original(policy, waiting_queue, *args, **kwargs)
        runtime.order_waiting_queue(waiting_queue, policy.tree_cache)
        return result

    def around_prefill(original: Callable, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
        if "running_batch" in kwargs:
            kwargs["running_batch"] = runtime.before_prefill(scheduler, kwargs["running_batch"])
        else:
            args = (*args[:-1], runtime.before_prefill(scheduler, args[-1]))
        try:
            return original(scheduler, *args, **kwargs)
        finally:
            runtime.end_iteration()

    def around_decode(original: Callable, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        runtime.before_decode(scheduler, batch)
        try:
            return original(scheduler, batch, *args, **kwargs)
        finally:
            runtime.end_iteration()

    def around_run_batch(original: Callable, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        runtime.begin_forward(scheduler, batch)
        started = time.monotonic()
        result = original(scheduler, batch, *args, **kwargs)
        runtime.forward_done(time.monotonic() - started)
        return result

    def after_batch_result(result: Any, _scheduler: Any, batch: Any, *_args: Any, **_kwargs: Any) -> Any:
        if batch is not None:
            runtime.batch_done(batch)
        return result

    def after_add_to_queue(result: Any, scheduler: Any, req: Any, is_retracted: bool = False, *_args: Any,
                           **_kwargs: Any) -> Any:
        if not is_retracted:
            runtime.note_arrival(scheduler, req)
        return result

    def around_idle(original: Callable, scheduler: Any, *args: Any, **kwargs: Any) -> bool:
        return runtime.idle(original(scheduler, *args, **kwargs))

    def after_abort(result: Any, scheduler: Any, recv_req: Any, *_args: Any, **_kwargs: Any) -> Any:
        runtime.aborted(scheduler, recv_req)
        return result

    HookRegistry.register(CALC_PRIORITY, calc_priority, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.get_prefill_adder_class", prefill_adder_hook(runtime), HookType.REPLACE)
    HookRegistry.register(f"{SCHEDULER}._get_new_batch_prefill_raw", around_prefill, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.update_running_batch", around_decode, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.run_batch", around_run_batch, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.process_batch_result", after_batch_result, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}._add_request_to_queue", after_add_to_queue, HookType.AFTER)
    HookRegistry.register(f"{SCHEDULER}.is_fully_idle", around_idle, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.abort_request", after_abort, HookType.AFTER)
    register_internal_state_hooks(runtime)
