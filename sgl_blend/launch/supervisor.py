"""`sgl-blend serve`: run SGLang's HTTP server with the plugin, and supervise it.

The server runs as a child in its own process group, so that Ctrl-C or SIGTERM of the supervisor
stops SGLang's scheduler and detokenizer too, and it holds the supervisor's lifeline
(`launch.lifeline`), so that a supervisor killed outright (SIGKILL, the OOM killer) takes the
server with it: no orphan is left holding a port, a data directory and gigabytes of KV memory.
A start on a port something already listens on is refused before SGLang loads anything, since the
health check would otherwise be answered by whatever holds the port.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from sgl_blend import cpu_compat
from sgl_blend.client import http
from sgl_blend.launch import lifeline
from sgl_blend.launch.flags import CPU_DEFAULT_FLAGS, CPU_ENV, flag_value, with_defaults
from sgl_blend.models.registry import resolve_model_path
from sgl_blend.server.config import CONFIG_ENV as BATCH_API_ENV
from sgl_blend.sglang_plugin.settings import SETTINGS_ENV

if TYPE_CHECKING:
    from sgl_blend.server.config import BatchApiConfig
    from sgl_blend.sglang_plugin.settings import PluginSettings

DEFAULT_PORT = 30000
# SGLang's drain after a SIGTERM checks its requests every 5 s, then gives its schedulers time to
# release their memory.
STOP_GRACE_S = 20.0


class ServerStartError(RuntimeError):
    """SGLang exited before it became healthy, or could not start at all."""


class PortInUse(ServerStartError):
    """Something already listens on the port the server was asked to take."""


@dataclass
class ServerProcess:
    """A running `sgl-blend` server: its process group, where it answers, and the write end of its
    lifeline (None for a server meant to outlive this process)."""

    process: subprocess.Popen
    base_url: str
    api_key: str | None = None
    log_path: Path | None = None
    argv: list[str] = field(default_factory=list)
    lifeline: int | None = None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the server, then SIGKILL the group's leftovers after the grace period. Only the
        HTTP process is signalled: SGLang drains its requests and stops its own scheduler and
        detokenizer (the batch runner aborts its lines at once, to run again), where a SIGTERM to
        every process would kill them under SGLang's watchdog, which reports a crash."""
        try:
            self.process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(self.process, signal.SIGKILL)
        code = self.process.wait()
        self._cut_lifeline()
        return code

    def kill(self) -> None:
        """Hard-kill the whole group at once, as a crash or the OOM killer would."""
        _signal_group(self.process, signal.SIGKILL)
        self.process.wait()
        self._cut_lifeline()

    def _cut_lifeline(self) -> None:
        """Close the lifeline once the server is gone (closing it earlier would SIGKILL a server
        that is still stopping gracefully)."""
        if self.lifeline is not None:
            os.close(self.lifeline)
            self.lifeline = None


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def server_argv(model: str, sglang_args: Sequence[str], cache_dir: Path | None = None) -> list[str]:
    """The server's full argument list: the resolved model path, user flags, then CPU defaults."""
    argv = ["--model-path", str(resolve_model_path(model, cache_dir)), *sglang_args]
    if not cpu_compat.cuda_present():
        argv = with_defaults(argv, CPU_DEFAULT_FLAGS)
    return with_defaults(argv, (("--port", str(DEFAULT_PORT)),))


def start_server(
    model: str,
    sglang_args: Sequence[str] = (),
    *,
    cache_dir: Path | None = None,
    log_path: Path | None = None,
    ready_timeout_s: float = 600.0,
    settings: PluginSettings | None = None,
    batch_api: BatchApiConfig | None = None,
    outlive: bool = False,
) -> ServerProcess:
    """Start the server and return once ``/health`` answers 200; raise with SGLang's error otherwise,
    or `PortInUse` at once when the port is taken.

    ``settings`` reach the plugin in every server process (None: the plugin's defaults).
    ``batch_api`` mounts the Files and Batches API on the server, with that configuration.
    The server dies with this process unless ``outlive`` (`sgl-blend serve --detach`).
    """
    argv = server_argv(model, sglang_args, cache_dir)
    host = flag_value(argv, "--host", "127.0.0.1")
    port = flag_value(argv, "--port")
    assert port is not None, "server_argv gives every server a port"
    refuse_busy_port(host, int(port))
    env = dict(os.environ)
    if not cpu_compat.cuda_present():
        env.update(CPU_ENV)
    env.pop(SETTINGS_ENV, None)
    if settings is not None:
        env.update(settings.to_env())
    env.pop(BATCH_API_ENV, None)
    if batch_api is not None:
        env.update(batch_api.to_env())
    read_end, write_end = lifeline.open_lifeline() if not outlive else (None, None)
    if read_end is not None:
        env.update(lifeline.child_env(read_end))
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab") if log_path else None
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "sgl_blend.launch.http_process", *argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT if log else None,
            start_new_session=True,
            pass_fds=() if read_end is None else (read_end,),
        )
    except BaseException:
        if write_end is not None:
            os.close(write_end)
        raise
    finally:
        if read_end is not None:
            os.close(read_end)
        if log is not None:
            log.close()
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    server = ServerProcess(
        process=process,
        base_url=f"http://{host}:{flag_value(argv, '--port')}",
        api_key=flag_value(argv, "--api-key"),
        log_path=log_path,
        argv=argv,
        lifeline=write_end,
    )
    try:
        wait_healthy(server, ready_timeout_s)
    except BaseException:
        server.stop(grace_s=5)
        raise
    return server


def refuse_busy_port(host: str, port: int) -> None:
    """Raise `PortInUse` when something listens on ``host:port``: bind the way uvicorn will
    (SO_REUSEADDR, so a port left in TIME_WAIT by a stopped server counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                return  # an address SGLang cannot bind either: it reports that itself
            raise PortInUse(
                f"port {port} on {host} is already in use: another server, perhaps one left running, "
                f"holds it (`ss -ltnp 'sport = :{port}'` names it); stop it or choose another --port"
            ) from None


def wait_healthy(server: ServerProcess, timeout_s: float) -> None:
    with http.client(server.base_url, server.api_key, timeout=5) as client:

        def healthy() -> None:
            code = server.process.poll()
            if code is not None:
                where = f"; see {server.log_path}" if server.log_path else ""
                raise ServerStartError(f"SGLang exited with code {code} before becoming healthy{where}")
            client.get("/health").raise_for_status()

        try:
            http.retry(healthy, timeout_s=timeout_s, backoff=http.Backoff(first_s=0.5, max_s=0.5))
        except httpx.HTTPError as error:
            raise ServerStartError(f"SGLang did not become healthy within {timeout_s:.0f} s ({error})") from None


def serve_forever(server: ServerProcess) -> int:
    """Block until the server exits or this process is told to stop; forward a stop to the group.

    The signal handler only records the request: stopping waits on the child, and a wait inside a
    handler that interrupted another wait on the same child would deadlock on Popen's lock.
    """
    requested: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: requested.append(signum))
    while not requested:
        code = server.process.poll()
        if code is not None:
            return code
        time.sleep(0.2)
    server.stop()
    return 128 + requested[0]
