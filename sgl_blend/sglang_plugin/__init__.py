"""The SGLang plugin: registered under the ``sglang.srt.plugins`` entry point.

SGLang calls `register` in each of its processes. The plugin reports itself through the
scheduler's internal state, which SGLang already exposes per DP rank as ``internal_states`` in
``GET /server_info``: that is how a test, or an operator, sees from outside that the plugin is
live in the scheduler process and what it is doing.
"""

from __future__ import annotations

import os
from typing import Any

from sgl_blend import __version__
from sgl_blend.launch import cpu_compat

INTERNAL_STATE_TARGET = (
    "sglang.srt.managers.scheduler_components.internal_state."
    "SchedulerInternalStateController.get_internal_state"
)


def plugin_state() -> dict[str, Any]:
    """What the plugin reports about the process it runs in, with the offline pool once it exists.
    ``dp_rank`` names the scheduler's DP rank (None without a DP controller): ``internal_states``
    lists the ranks in the order they answered, not by rank."""
    from sglang.srt.runtime_context import get_parallel

    from sgl_blend.sglang_plugin.bros_hooks import active_bros
    from sgl_blend.sglang_plugin.colocation_hooks import active_colocation
    from sgl_blend.sglang_plugin.scheduler_hooks import active_pool, active_recorder

    pool, colocation, recorder, bros = active_pool(), active_colocation(), active_recorder(), active_bros()
    return {
        "version": __version__,
        "pid": os.getpid(),
        "dp_rank": get_parallel().dp_rank,
        "cpu_kernel_stub": cpu_compat.kernel_stub_active(),
        "offline": pool.snapshot() if pool is not None else None,
        "colocation": colocation.snapshot() if colocation is not None else None,
        "bros": bros.snapshot() if bros is not None else None,
        **(recorder.snapshot() if recorder is not None else {}),
    }


def _report_state(result: Any, *_args: Any, **_kwargs: Any) -> Any:
    from sgl_blend.sglang_plugin.scheduler_hooks import STATE_KEY

    result.internal_state[STATE_KEY] = plugin_state()
    return result


def register() -> None:
    cpu_compat.install()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sgl_blend.sglang_plugin.radix_backend import register_backend
    from sgl_blend.sglang_plugin.scheduler_hooks import register_scheduler_hooks

    HookRegistry.register(INTERNAL_STATE_TARGET, _report_state, HookType.AFTER)
    register_scheduler_hooks()
    register_backend()
