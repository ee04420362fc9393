"""The host's CPU over one replay: how many cores each part of the run kept busy.

On the 2-core host an emulated device waits for nothing but the host, so a replay's latencies are
as much the host's as the engine's: the scheduler shares two cores with the server's own process
(tokenizer manager, Batch API runner, streaming), SGLang's detokenizer and the client replaying
the trace. A replay's report carries these shares, so a run that saturated the host says so.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

# SGLang names its subprocesses by their role (setproctitle); the rest of the tree is the server.
ROLES = {"sglang::scheduler": "scheduler", "sglang::detokenizer": "detokenizer"}


def role_of(process: psutil.Process) -> str:
    try:
        title = " ".join(process.cmdline()) or process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "server"
    return next((role for prefix, role in ROLES.items() if title.startswith(prefix)), "server")


def cpu_seconds(server_pid: int) -> dict[str, float]:
    """User and system CPU seconds so far of the server's process tree by role, and of this process
    (the client); a process that ended since is left out."""
    seconds = {"scheduler": 0.0, "detokenizer": 0.0, "server": 0.0}
    try:
        root = psutil.Process(server_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for process in tree:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[role_of(process)] += times.user + times.system
    client = psutil.Process(os.getpid()).cpu_times()
    seconds["client"] = client.user + client.system
    return seconds


@dataclass
class CpuMeter:
    """Started before a replay, read after it: cores each role kept busy, and the whole host's."""

    server_pid: int
    started: float = 0.0
    before: dict[str, float] | None = None
    host_before: float = 0.0

    def start(self) -> CpuMeter:
        self.before = cpu_seconds(self.server_pid)
        self.host_before = _host_busy_seconds()
        self.started = time.monotonic()
        return self

    def read(self) -> dict[str, float]:
        assert self.before is not None, "start() first"
        elapsed = max(time.monotonic() - self.started, 1e-9)
        after = cpu_seconds(self.server_pid)
        cores = {role: round((after[role] - self.before[role]) / elapsed, 2) for role in after}
        cores["host_busy"] = round((_host_busy_seconds() - self.host_before) / elapsed, 2)
        cores["host_cores"] = psutil.cpu_count() or 0
        return cores


def _host_busy_seconds() -> float:
    """Every core's busy seconds so far (Linux's guest time is inside its user time)."""
    times = psutil.cpu_times()
    return sum(getattr(times, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq", "steal"))
