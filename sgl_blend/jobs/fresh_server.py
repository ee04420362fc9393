"""Running a `run-batch` job on a real server: a fresh one launched for a policy (its SGLang flags
and plugin settings), or one already running, with the job's lines spread over its DP ranks
and the plugin's final scheduler state read back from ``/server_info``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from sgl_blend.client import http
from sgl_blend.core.policy_registry import RUN_BATCH, lookup
from sgl_blend.jobs.lines import BatchLine
from sgl_blend.jobs.run_batch import JobTotals, finished_keys, read_lines, run_job
from sgl_blend.sglang_plugin.settings import PluginSettings, configured_hardware

if TYPE_CHECKING:
    from sgl_blend.core.cost_model import HardwareSpec
    from sgl_blend.launch.supervisor import ServerProcess

# Every policy runs with the same engine knobs: mixed prefill/decode batches, as the simulator models.
ENGINE_FLAGS = ("--enable-mixed-chunk",)


def plan_dp_ranks(input_path: Path, done_ids: set[str], model_path: str, hardware: HardwareSpec,
                  dp_size: int) -> dict[int, int]:
    """line number -> DP rank for the lines still to run (first occurrence of each custom_id)."""
    from sgl_blend.jobs.line_work import LinePartitioner, shares_by_rank

    lines: dict[str, BatchLine] = {}
    for item in read_lines(input_path):
        if isinstance(item, BatchLine) and item.custom_id not in done_ids:
            lines.setdefault(item.custom_id, item)
    return shares_by_rank(LinePartitioner(model_path, hardware).shares(lines.values(), dp_size))


def policy_launch(policy: str, hardware: str | None = None) -> tuple[list[str], PluginSettings]:
    """SGLang flags and plugin settings for a policy: ours through the pool, or SGLang's own."""
    entry = lookup(policy, RUN_BATCH)
    settings = PluginSettings(offline_policy=policy, hardware=hardware or None)
    flags = [*ENGINE_FLAGS, "--schedule-policy", entry.sglang_schedule]
    if policy == "blendserve" and settings.device().blending_pays:
        # BlendServe's tree annotations live in the radix cache: evict the prefixes that no pending
        # line will reuse first, since two scan sides keep two prefix families warm at once. With
        # one cursor (no blending on this device) SGLang's own radix cache and LRU serve DFS best.
        flags += ["--radix-cache-backend", "sgl-blend", "--radix-eviction-policy", "priority"]
    return flags, settings


def run_on_fresh_server(
    model: str,
    policy: str,
    input_path: Path,
    output_path: Path,
    error_path: Path,
    *,
    sglang_args: Sequence[str] = (),
    hardware: str | None = None,
    server_log: Path | None = None,
    show_progress: bool = True,
    max_inflight: int = 1024,
    while_running: Callable[[ServerProcess], None] | None = None,
    settings_overrides: Mapping[str, Any] | None = None,
) -> tuple[JobTotals, dict[str, Any]]:
    """Start a server for one policy, run the job, and stop it.

    Returns the job totals and the plugin's final scheduler state. ``while_running`` runs in a
    thread alongside the job (online traffic, for instance) and is joined before the server stops.
    ``settings_overrides`` change `PluginSettings` fields of the policy's (``record_policy_calls``, for instance).
    """
    from sgl_blend.launch.supervisor import start_server

    flags, settings = policy_launch(policy, hardware)
    server = start_server(model, ["--enable-cache-report", *flags, *sglang_args], log_path=server_log,
                          settings=settings.updated(**(settings_overrides or {})))
    try:
        return run_on_server(server, input_path, output_path, error_path, hardware=hardware, policy=policy,
                             show_progress=show_progress, max_inflight=max_inflight, while_running=while_running)
    finally:
        server.stop()


def run_on_server(
    server: ServerProcess,
    input_path: Path,
    output_path: Path,
    error_path: Path,
    *,
    hardware: str | None = None,
    policy: str | None = None,
    show_progress: bool = True,
    max_inflight: int = 1024,
    while_running: Callable[[ServerProcess], None] | None = None,
) -> tuple[JobTotals, dict[str, Any]]:
    """Run the job on a running server, its lines spread over the server's DP ranks. A
    ``policy`` that `LinePlanner.for_policy` plans has the whole job planned first and feeds it in plan order."""
    import threading

    from sgl_blend.launch.flags import flag_value
    from sgl_blend.jobs.line_plan import LinePlanner

    info = http.server_info(server.base_url, server.api_key)
    model_path = flag_value(server.argv, "--model-path")
    device = configured_hardware(int(info.get("tp_size") or 1), hardware)
    dp_ranks = None
    if http.dp_size(info) > 1:
        dp_ranks = plan_dp_ranks(input_path, finished_keys(output_path, error_path)[0], model_path, device,
                                 http.dp_size(info))
    planner = LinePlanner.for_policy(policy, model_path, device) if policy else None
    side_thread = threading.Thread(target=while_running, args=(server,)) if while_running else None
    if side_thread:
        side_thread.start()
    totals = asyncio.run(run_job(input_path, output_path, error_path, server.base_url, api_key=server.api_key,
                                 max_inflight=max_inflight, show_progress=show_progress, dp_ranks=dp_ranks,
                                 planner=planner))
    if side_thread:
        side_thread.join()
    return totals, scheduler_plugin_state(server)


def scheduler_plugin_state(server: ServerProcess) -> dict[str, Any]:
    """The plugin's state as the first DP rank's scheduler reports it in ``/server_info``, with
    every rank's own state, by rank, under ``ranks`` when there are several."""
    info = http.server_info(server.base_url, server.api_key)
    states = [state.get("sgl_blend", {}) for state in info["internal_states"]]
    states.sort(key=lambda state: state.get("dp_rank") or 0)
    return {**states[0], "ranks": states} if len(states) > 1 else states[0]
