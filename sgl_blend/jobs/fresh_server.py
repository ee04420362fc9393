"""Running a `run-batch` job on a real server: a fresh one launched for a policy (its SGLang flags
and plugin settings), or one already running, and the plugin's final scheduler state read back
from ``/server_info``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from sgl_blend.client import http
from sgl_blend.core.policy_registry import RUN_BATCH, lookup
from sgl_blend.emulation.clock_reader import job_time, read_clock
from sgl_blend.emulation.launch import emulated_launch
from sgl_blend.jobs.run_batch import EmulatedJob, JobEngine, JobFiles, JobOptions, JobTotals, run_job
from sgl_blend.launch.flags import flag_value, with_defaults
from sgl_blend.sglang_plugin.settings import PluginSettings

if TYPE_CHECKING:
    from sgl_blend.launch.supervisor import ServerProcess

def policy_launch(policy: str, hardware: str | None = None) -> PluginSettings:
    """The plugin settings a run-batch policy runs with (the registry says what the name does)."""
    lookup(policy, RUN_BATCH)
    return PluginSettings(offline_policy=policy, hardware=hardware or None)


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
    options: JobOptions = JobOptions(),
    while_running: Callable[[ServerProcess], None] | None = None,
    settings_overrides: Mapping[str, Any] | None = None,
    emulate: str | None = None,
    emulate_realtime: float | None = None,
) -> tuple[JobTotals, dict[str, Any]]:
    """Start a server for one policy, run the job, and stop it.

    Returns the job totals and the plugin's final scheduler state. ``while_running`` runs in a
    thread alongside the job (online traffic, for instance) and is joined before the server stops.
    ``settings_overrides`` change `PluginSettings` fields of the policy's (``record_policy_calls``, for instance).
    ``emulate`` names a device to emulate (`sgl_blend.emulation`): ``model`` may then be a priced
    shape such as ``llama-3.1-8b``, and the totals carry the job's emulated time; ``emulate_realtime``
    makes each emulated forward last that factor times its price on the wall clock.
    """
    from sgl_blend.launch.supervisor import start_server

    settings = policy_launch(policy, hardware).updated(**(settings_overrides or {}))
    args = ["--enable-cache-report", *sglang_args]
    if emulate:
        launch = emulated_launch(emulate, model, args, realtime_factor=emulate_realtime)
        model, args, settings = str(launch.model_path), launch.sglang_args, launch.settings_for(settings)
    server = start_server(model, with_defaults(args, settings.sglang_flags()), log_path=server_log,
                          settings=settings)
    try:
        return run_on_server(server, input_path, output_path, error_path, settings=settings, options=options,
                             while_running=while_running)
    finally:
        server.stop()


def run_on_server(
    server: ServerProcess,
    input_path: Path,
    output_path: Path,
    error_path: Path,
    *,
    settings: PluginSettings | None = None,
    options: JobOptions = JobOptions(),
    while_running: Callable[[ServerProcess], None] | None = None,
) -> tuple[JobTotals, dict[str, Any]]:
    """Run the job on a running server started with ``settings`` (the plugin's defaults when
    None), its lines spread over the server's DP ranks and planned as the settings' policy plans."""
    settings = settings or PluginSettings()
    tp_size = int(flag_value(server.argv, "--tp-size", "1"))
    model_path = flag_value(server.argv, "--model-path")
    engine = JobEngine(server.base_url, model_path, settings.cost_model(model_path, tp_size), api_key=server.api_key,
                       alive=lambda: server.process.poll() is None)
    side_thread = threading.Thread(target=while_running, args=(server,)) if while_running else None
    if side_thread:
        side_thread.start()
    clock = read_clock(server.base_url, server.api_key) if settings.emulation else None
    try:
        totals = run_job(JobFiles(input_path, output_path, error_path), engine, settings.offline_policy, options)
    finally:
        if side_thread:
            side_thread.join()
    if clock is not None:
        end = read_clock(server.base_url, server.api_key)
        totals.emulated = EmulatedJob(settings.emulation.device, job_time(clock, end),
                                      next(iter(end.ranks.values())).get("realtime"))
    return totals, scheduler_plugin_state(server)


def scheduler_plugin_state(server: ServerProcess) -> dict[str, Any]:
    """The plugin's state as the first DP rank's scheduler reports it in ``/server_info``, with
    every rank's own state, by rank, under ``ranks`` when there are several."""
    info = http.server_info(server.base_url, server.api_key)
    states = [state.get("sgl_blend", {}) for state in info["internal_states"]]
    states.sort(key=lambda state: state.get("dp_rank") or 0)
    return {**states[0], "ranks": states} if len(states) > 1 else states[0]
