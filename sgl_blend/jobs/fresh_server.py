"""Running a `run-batch` job on a fresh server: launched for a policy (its SGLang flags and plugin
settings) with the job's Batch API, followed to its end, its emulated time and the plugin's final
scheduler state read back from ``/server_info``, and stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sgl_blend.client import http
from sgl_blend.core.policy_registry import RUN_BATCH, lookup
from sgl_blend.emulation.clock_reader import job_time, read_clock
from sgl_blend.emulation.launch import emulated_launch
from sgl_blend.jobs.run_batch import (
    EmulatedJob,
    JobFiles,
    JobOptions,
    JobTotals,
    finished_totals,
    follow_job,
    job_config,
    open_job,
)
from sgl_blend.launch.colocation import with_free_port
from sgl_blend.launch.flags import with_defaults
from sgl_blend.server.store import TERMINAL_STATUSES
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
    announce: Callable[[str], None] = lambda _message: None,
) -> tuple[JobTotals, dict[str, Any]]:
    """Run (or resume) the job on a server started for one policy, and stop it.

    Returns the job totals and the plugin's final scheduler state (empty when the job had already
    finished: no server is started). ``while_running`` runs in a thread alongside the job (online
    traffic, for instance) and is joined before the server stops; ``announce`` is told when the
    server starts and when it is ready. ``settings_overrides`` change `PluginSettings` fields of the policy's
    (``record_policy_calls``, for instance). ``emulate`` names a device to emulate
    (`sgl_blend.emulation`): ``model`` may then be a priced shape such as ``llama-3.1-8b``, and the
    totals carry the job's emulated time; ``emulate_realtime`` makes each emulated forward last
    that factor times its price on the wall clock. Raises `jobs.run_batch.JobRefused` before any
    server starts for an input with no requests or another job's store.
    """
    from sgl_blend.launch.supervisor import start_server

    files = JobFiles(input_path, output_path, error_path)
    row = open_job(files)
    if row.status in TERMINAL_STATUSES:
        return finished_totals(files, row), {}
    settings = policy_launch(policy, hardware).updated(**(settings_overrides or {}))
    # A port of its own, so jobs side by side on one machine do not collide.
    args = with_free_port(["--enable-cache-report", *sglang_args])
    if emulate:
        launch = emulated_launch(emulate, model, args, realtime_factor=emulate_realtime)
        model, args, settings = str(launch.model_path), launch.sglang_args, launch.settings_for(settings)
    announce(f"starting the server{f' (log: {server_log})' if server_log else ''} ...")
    server = start_server(
        model,
        with_defaults(args, settings.sglang_flags()),
        log_path=server_log,
        settings=settings,
        batch_api=job_config(files, row, options),
    )
    announce(f"the server is ready at {server.base_url}; its batch runner runs the job")
    side_thread = threading.Thread(target=while_running, args=(server,)) if while_running else None
    try:
        if side_thread:
            side_thread.start()
        totals = follow_job(files, row, lambda: server.process.poll() is None, options.show_progress)
        if settings.emulation and server.process.poll() is None:
            end = read_clock(server.base_url, server.api_key)
            totals.emulated = EmulatedJob(
                settings.emulation.device, job_time(None, end), next(iter(end.ranks.values())).get("realtime")
            )
        state = scheduler_plugin_state(server) if server.process.poll() is None else {}
    finally:
        if side_thread and side_thread.is_alive():
            side_thread.join()
        server.stop()
    return totals, state


def scheduler_plugin_state(server: ServerProcess) -> dict[str, Any]:
    """The plugin's state as the first DP rank's scheduler reports it in ``/server_info``, with
    every rank's own state, by rank, under ``ranks`` when there are several."""
    info = http.server_info(server.base_url, server.api_key)
    states = [state.get("sgl_blend", {}) for state in info["internal_states"]]
    states.sort(key=lambda state: state.get("dp_rank") or 0)
    return {**states[0], "ranks": states} if len(states) > 1 else states[0]
