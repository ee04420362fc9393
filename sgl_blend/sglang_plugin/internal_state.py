"""The plugin's side of SGLang's internal-state controller: ``GET /server_info`` and ``POST /set_internal_state``.

SGLang already exposes each scheduler's internal state per DP rank (``internal_states`` in
``/server_info``) and takes runtime settings through ``/set_internal_state``; the plugin adds its
state under ``sgl_blend`` and its settings as ``sgl_blend_*`` keys, so a test, a bench or an
operator sees from outside that the plugin is live in the scheduler process and what it does,
and the SLO profiler moves the latency budget of a running server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.runtime import PluginRuntime

logger = logging.getLogger(__name__)
STATE_KEY = "sgl_blend"
SETTING_PREFIX = "sgl_blend_"
RESET_RECORDS = "reset_records"
CLEAR_BUDGET = "clear_latency_budget"
NUMERIC_SETTINGS = (
    "latency_budget_s",
    "headroom_s",
    "ttft_slo_s",
    "tpot_slo_s",
    "idle_budget_s",
    "reserve_sigmas",
    "reserve_window_s",
    "min_offline_chunk",
    "calibration_alpha",
)
Handler = tuple[Callable[[str, Any], None], Callable[[str, Any], None]]


def update_handlers(runtime: PluginRuntime) -> dict[str, Handler]:
    """Validate/apply pairs for ``POST /set_internal_state {"server_args": {...}}``. SGLang takes only
    numbers there, so each numeric `ColocationConfig` field is a key of its own
    (``sgl_blend_latency_budget_s``), ``sgl_blend_clear_latency_budget: 1`` removes the budget and
    ``sgl_blend_reset_records: 1`` clears the per-iteration record. The mode and the latency model
    are launch settings."""

    def change(key: str, value: Any) -> dict[str, Any]:
        field = key[len(SETTING_PREFIX) :]
        if field == CLEAR_BUDGET:
            return {"latency_budget_s": None}
        return {field: int(value) if field == "min_offline_chunk" else float(value)}

    def validate(key: str, value: Any) -> None:
        try:
            runtime.mode.current_config().updated(change(key, value))
        except (TypeError, ValueError) as error:
            raise sgl.UpdateRejected(f"{key}: {error}") from None

    def apply(key: str, value: Any) -> None:
        config = runtime.mode.reconfigure(change(key, value))
        logger.info("sgl-blend co-location now %s", config.to_json())

    def reset(_key: str, _value: Any) -> None:
        runtime.reset_records()

    handlers: dict[str, Handler] = {
        SETTING_PREFIX + field: (validate, apply) for field in (*NUMERIC_SETTINGS, CLEAR_BUDGET)
    }
    handlers[SETTING_PREFIX + RESET_RECORDS] = (lambda _key, _value: None, reset)
    return handlers


def register_internal_state_hooks(runtime: PluginRuntime) -> None:
    def report_state(result: Any, *_args: Any, **_kwargs: Any) -> Any:
        result.internal_state[STATE_KEY] = runtime.state()
        return result

    def with_update_handlers(handlers: dict, *_args: Any, **_kwargs: Any) -> dict:
        for key, (validate, apply) in update_handlers(runtime).items():
            handlers[key] = sgl.UpdateHandler(validate, apply)
        return handlers

    sgl.register_hook(sgl.GET_INTERNAL_STATE, report_state)
    sgl.register_hook(sgl.UPDATE_HANDLERS, with_update_handlers)
