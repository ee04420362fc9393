"""Where the plugin enters SGLang's scheduler: `HookRegistry` hooks, each a thin call into the runtime.

- An AROUND hook on ``SchedulePolicy.calc_priority`` lets SGLang order the waiting queue as it
  always does, then moves online requests first and offline requests into the policy's order.
- A REPLACE hook on ``Scheduler.get_prefill_adder_class`` returns the plugin's `PrefillAdder`
  subclass (`prefill_adder`).
- AROUND hooks on ``Scheduler._get_new_batch_prefill_raw`` and ``Scheduler.update_running_batch``
  let the mode plan before SGLang builds a prefill or a decode batch, and drop the plan after;
  the prefill hook passes on the running batch the mode returns (held decodes put back).
- An AROUND hook on ``Scheduler.is_fully_idle`` keeps SGLang busy while the mode holds decodes
  out of the running batch or offline requests wait in the pool's backlog (an idle scheduler
  checks its KV pool for leaks and sleeps), and an AROUND hook on ``Scheduler.abort_request``
  puts the backlog's requests it names where SGLang's abort finds them, and frees held decodes,
  which SGLang's abort cannot see.
- An AROUND hook on ``Scheduler.run_batch`` keeps the per-iteration record and times the forward;
  an AFTER hook on ``process_batch_result`` reports progress and completions.
- An AFTER hook on ``SchedulerLoadInquirer.get_loads`` counts a mixed iteration's decodes in the
  load report's running requests (`load_report`), and the backlog in its waiting ones.
- Every hook's own time, outside SGLang's code, is the plugin's time in the loop (`plugin_time`).
- An AFTER hook on ``Scheduler._add_request_to_queue`` notes when requests first arrive (an
  offline one leaves SGLang's queue for the pool's backlog) and when a running one comes back.
- An AFTER hook on ``GenerateReqInput.__getitem__`` (in the HTTP process) gives the samples of an
  ``n > 1`` request its routing key, which SGLang leaves off them; an AROUND hook on the HTTP
  server's post-start ``/freeze_gc`` call holds it until the server listens.
- The internal-state controller's hooks live in `internal_state`.

The hooks only translate SGLang's calls, reading its arguments by name (`sglang_boundary.argument`,
each found once, when the hooks are registered); what they act on is the `PluginRuntime`.
Targets and parameters are the boundary table's rows.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.internal_state import register_internal_state_hooks
from sgl_blend.sglang_plugin.prefill_adder import prefill_adder_hook
from sgl_blend.sglang_plugin.runtime import PluginRuntime


def register_hooks(runtime: PluginRuntime) -> None:
    waiting_queue = sgl.argument(sgl.CALC_PRIORITY, "waiting_queue")
    running_arg = sgl.argument(sgl.NEW_PREFILL_BATCH, "running_batch")
    decode_batch = sgl.argument(sgl.UPDATE_RUNNING_BATCH, "batch")
    forward_batch = sgl.argument(sgl.RUN_BATCH, "batch")
    result_batch = sgl.argument(sgl.PROCESS_BATCH_RESULT, "batch")
    queued_req, retracted = (
        sgl.argument(sgl.ADD_REQUEST_TO_QUEUE, "req"),
        sgl.argument(sgl.ADD_REQUEST_TO_QUEUE, "is_retracted"),
    )
    abort_req = sgl.argument(sgl.ABORT_REQUEST, "recv_req")

    clock = runtime.time

    def calc_priority(original: Callable, *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        with clock:
            runtime.order_waiting_queue(waiting_queue.read(args, kwargs), args[0].tree_cache)
        return result

    def around_prefill(original: Callable, *args: Any, **kwargs: Any) -> Any:
        with clock:
            batch = runtime.before_prefill(args[0], running_arg.read(args, kwargs))
            args, kwargs = running_arg.replaced(args, kwargs, batch)
        try:
            result = original(*args, **kwargs)
        except BaseException:
            runtime.end_iteration()
            raise
        with clock:
            if sgl.prefill_built(result):
                runtime.end_iteration()
            else:
                runtime.prefill_built_nothing()
        return result

    def around_decode(original: Callable, *args: Any, **kwargs: Any) -> Any:
        with clock:
            runtime.before_decode(args[0], decode_batch.read(args, kwargs))
        try:
            return original(*args, **kwargs)
        finally:
            with clock:
                runtime.end_iteration()

    def around_run_batch(original: Callable, *args: Any, **kwargs: Any) -> Any:
        with clock:
            runtime.begin_forward(args[0], forward_batch.read(args, kwargs))
        started = time.monotonic()
        result = original(*args, **kwargs)
        forward_s = time.monotonic() - started
        with clock:
            runtime.forward_done(forward_s)
        return result

    def after_batch_result(result: Any, *args: Any, **kwargs: Any) -> Any:
        with clock:
            batch = result_batch.read(args, kwargs)
            if batch is not None:
                runtime.batch_done(batch)
        return result

    def after_add_to_queue(result: Any, *args: Any, **kwargs: Any) -> Any:
        with clock:
            if retracted.read(args, kwargs):
                runtime.requeued(queued_req.read(args, kwargs))
            else:
                runtime.note_arrival(args[0], queued_req.read(args, kwargs))
        return result

    def around_idle(original: Callable, *args: Any, **kwargs: Any) -> bool:
        return runtime.idle(original(*args, **kwargs))

    def after_get_loads(load: Any, *args: Any, **kwargs: Any) -> Any:
        running = runtime.running_requests(args[0].get_running_batch())
        if running is not None:
            load.num_running_reqs = running
        load.num_waiting_reqs += len(runtime.backlog)
        return load

    def around_abort(original: Callable, *args: Any, **kwargs: Any) -> Any:
        recv_req = abort_req.read(args, kwargs)
        with clock:
            matched = runtime.before_abort(args[0], recv_req)
        result = original(*args, **kwargs)
        with clock:
            runtime.aborted(args[0], recv_req, matched)
        return result

    sgl.register_hook(sgl.CALC_PRIORITY, calc_priority)
    sgl.register_hook(sgl.PREFILL_ADDER_CLASS, prefill_adder_hook(runtime))
    sgl.register_hook(sgl.NEW_PREFILL_BATCH, around_prefill)
    sgl.register_hook(sgl.UPDATE_RUNNING_BATCH, around_decode)
    sgl.register_hook(sgl.RUN_BATCH, around_run_batch)
    sgl.register_hook(sgl.PROCESS_BATCH_RESULT, after_batch_result)
    sgl.register_hook(sgl.ADD_REQUEST_TO_QUEUE, after_add_to_queue)
    sgl.register_hook(sgl.IS_FULLY_IDLE, around_idle)
    sgl.register_hook(sgl.GET_LOADS, after_get_loads)
    sgl.register_hook(sgl.ABORT_REQUEST, around_abort)
    sgl.register_hook(sgl.SUBREQUEST_ROUTING_KEY, subrequest_keeps_routing_key)
    sgl.register_hook(sgl.FREEZE_GC_AFTER_WARMUP, freeze_gc_once_listening)
    register_internal_state_hooks(runtime)


def subrequest_keeps_routing_key(sub: Any, batched: Any, *args: Any, **kwargs: Any) -> Any:
    """A sample of an ``n > 1`` request (or an item of a batched one) carries the request's routing
    key, so an offline line's samples reach the scheduler as offline work with its placement."""
    if sub.routing_key is None:
        sub.routing_key = batched.routing_key
    return sub


# How long the post-start /freeze_gc waits for the server to listen (its start-up after the
# warmup thread began: uvicorn binding, the lifespans).
LISTEN_WAIT_S = 120.0


def freeze_gc_once_listening(original: Callable, *args: Any, **kwargs: Any) -> Any:
    """SGLang's warmup thread posts ``/freeze_gc`` to the server's own port; with
    ``--skip-server-warmup`` it does so before uvicorn listens, and the refused connection is
    logged with its traceback on every start. Wait for the port, then let it."""
    server_args = sgl.argument(sgl.FREEZE_GC_AFTER_WARMUP, "server_args").read(args, kwargs)
    host = "127.0.0.1" if server_args.host in ("0.0.0.0", "::", "") else server_args.host
    deadline = time.monotonic() + LISTEN_WAIT_S
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, server_args.port), timeout=1.0).close()
            break
        except OSError:
            time.sleep(0.1)
    return original(*args, **kwargs)
