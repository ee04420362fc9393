"""Hooks that put the offline pool into SGLang's scheduler through its own extension points.

- An AROUND hook on ``SchedulePolicy.calc_priority`` lets SGLang order the waiting queue as it
  always does, then moves online requests first and offline requests into the policy's order.
- A REPLACE hook on ``Scheduler.get_prefill_adder_class`` returns a `PrefillAdder` subclass that
  stops at the first offline request the policy did not propose: the queue is ordered so that
  every request behind it is unproposed offline work too.
- An AFTER hook on ``Scheduler.process_batch_result`` reports progress and completions.

The pool lives in the scheduler process and is created on first use, from the environment that
`sgl-blend serve` passes down (``SGLBLEND_OFFLINE_POLICY``, ``SGLBLEND_HARDWARE``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable

from sgl_blend.sglang_plugin.offline_pool import OfflinePool

if TYPE_CHECKING:
    from sgl_blend.core.cost_model import HardwareSpec

POLICY_ENV = "SGLBLEND_OFFLINE_POLICY"
HARDWARE_ENV = "SGLBLEND_HARDWARE"
DEFAULT_POLICY = "blendserve"
DEFAULT_HARDWARE = "a100-80g"
OFF = "off"

logger = logging.getLogger(__name__)
_pool: OfflinePool | None = None
_failed = False


def active_pool() -> OfflinePool | None:
    return _pool


def _guarded(step: Callable[..., Any]) -> Callable[..., Any]:
    """A plugin error must never take the scheduler down: log it once, drop the pool, and let
    SGLang schedule everything (offline requests included) its own way from then on."""

    def run(*args: Any, **kwargs: Any) -> Any:
        global _pool, _failed
        if _pool is None:
            return None
        try:
            return step(*args, **kwargs)
        except Exception:
            logger.exception("sgl-blend offline pool failed; falling back to SGLang's own scheduling")
            _pool, _failed = None, True
            return None

    return run


def _free_kv_tokens(tree_cache: Any) -> int:
    return int(tree_cache.token_to_kv_pool_allocator.available_size() + tree_cache.evictable_size())


def _create_pool(tree_cache: Any) -> OfflinePool | None:
    name = os.environ.get(POLICY_ENV, DEFAULT_POLICY)
    if name == OFF:
        return None
    from sglang.srt.runtime_context import get_server_args

    from sgl_blend.core.cost_model import ModelSpec
    from sgl_blend.core.policies import make_policy

    server_args = get_server_args()
    model = ModelSpec.from_hf_dir(server_args.model_path)
    hardware = configured_hardware(server_args.tp_size)
    capacity = int(tree_cache.token_to_kv_pool_allocator.size)
    return OfflinePool(make_policy(name, model, hardware), name, capacity)


def configured_hardware(tp_size: int = 1, name: str | None = None) -> HardwareSpec:
    """The device ``name`` (by default the one `sgl-blend serve --hardware` passed down as
    ``SGLBLEND_HARDWARE``) as one scheduler sees it: a TP group of ``tp_size`` devices has that
    many times the compute, bandwidth and KV memory of one."""
    from sgl_blend.core.cost_model import HardwareSpec

    return HardwareSpec.resolve(name or os.environ.get(HARDWARE_ENV, DEFAULT_HARDWARE)).scaled(tp_size)


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


@_guarded
def _may_admit(req: Any) -> bool:
    return _pool.may_admit(req)


@_guarded
def _admitted(req: Any, tree_cache: Any) -> None:
    _pool.on_admitted(req, tree_cache)


def _after_batch_result(result: Any, _scheduler: Any, batch: Any, *_args: Any, **_kwargs: Any) -> Any:
    if batch is not None:
        _report_batch(batch.reqs)
    return result


def _blend_prefill_adder_class() -> type:
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    class BlendPrefillAdder(PrefillAdder):
        """SGLang's adder, admitting offline work only in the order the policy proposed."""

        def add_one_req(self, req: Any, has_chunked_req: bool, truncation_align_size: Any) -> Any:
            if _may_admit(req) is False:
                return AddReqResult.OTHER
            result = super().add_one_req(req, has_chunked_req, truncation_align_size)
            if self.can_run_list and self.can_run_list[-1] is req:
                _admitted(req, self.tree_cache)
            return result

    return BlendPrefillAdder


def register_scheduler_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    adder_class: list[type] = []

    def prefill_adder_class(_scheduler: Any) -> type:
        if not adder_class:
            adder_class.append(_blend_prefill_adder_class())
        return adder_class[0]

    HookRegistry.register(
        "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority", _calc_priority, HookType.AROUND
    )
    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.get_prefill_adder_class", prefill_adder_class, HookType.REPLACE
    )
    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.process_batch_result", _after_batch_result, HookType.AFTER
    )
