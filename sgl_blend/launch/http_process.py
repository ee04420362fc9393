"""The SGLang HTTP server process that `sgl-blend serve` supervises.

It is SGLang's own launcher with these differences: it dies with its supervisor
(`launch.lifeline`); the CPU compatibility finder is installed first, so the process imports even
where no ``.pth`` start-up line put it in place; the line route other servers' batch runners use
is mounted on SGLang's app before it starts, and, when `sgl-blend serve` passed a Batch API
configuration, the Files and Batches routes too (same host and port as SGLang's own routes, and
the same keys: the key gate then guards SGLang's routes), with the batch runner inside this
process. On a CPU with several scheduler ranks, each is bound to its own cores.
"""

from __future__ import annotations

import os
import secrets
import sys
from typing import TYPE_CHECKING

from sgl_blend import cpu_compat
from sgl_blend.launch import lifeline
from sgl_blend.sglang_plugin.settings import PluginSettings, SettingsError

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

    from sgl_blend.server.config import BatchApiConfig


def main(argv: list[str] | None = None) -> None:
    lifeline.watch_parent()
    cpu_compat.install()
    try:
        settings = PluginSettings.from_env()
    except SettingsError as error:
        sys.exit(f"error: {error}")
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(list(sys.argv[1:] if argv is None else argv))
    _bind_cpu_ranks(server_args)
    _mount_routes(server_args, settings)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def _bind_cpu_ranks(server_args: ServerArgs) -> None:
    """On a CPU, give each scheduler process (DP x TP x PP of them) its own cores, unless the user
    chose a binding: SGLang's default wants one NUMA node per rank and refuses to start without."""
    from sgl_blend.launch.flags import CPU_THREADS_BIND_ENV, cpu_thread_binding

    ranks = server_args.dp_size * server_args.tp_size * server_args.pp_size
    if ranks > 1 and not cpu_compat.cuda_present() and not os.environ.get(CPU_THREADS_BIND_ENV):
        os.environ[CPU_THREADS_BIND_ENV] = cpu_thread_binding(ranks, os.sched_getaffinity(0))


def _mount_routes(server_args: ServerArgs, settings: PluginSettings) -> None:
    from sgl_blend.server.config import BatchApiConfig

    config = BatchApiConfig.from_env()
    if config is not None and getattr(server_args, "tokenizer_worker_num", 1) != 1:
        sys.exit("error: the Batch API needs --tokenizer-worker-num 1 (or sgl-blend serve --no-batch-api)")
    from sglang.srt.entrypoints.http_server import app

    from sgl_blend.batch_lines.plan import LinePlanner
    from sgl_blend.server.app import install, loopback_url
    from sgl_blend.server.assignment import PrefixAssigner
    from sgl_blend.server.db import StoreInUse

    cost_model = settings.cost_model(server_args.model_path, server_args.tp_size)
    api_key = server_args.api_key  # the operator's: SGLang may be given a key of its own next
    self_key = _key_for_sglang_itself(server_args, config)
    try:
        install(
            app,
            config,
            self_url=loopback_url(server_args.host, server_args.port),
            api_key=api_key,
            admin_api_key=server_args.admin_api_key,
            self_key=self_key,
            assigner=PrefixAssigner(cost_model),
            planner=LinePlanner.for_policy(settings.offline_policy, cost_model),
        )
    except (StoreInUse, ValueError, OSError) as error:
        sys.exit(f"error: the Batch API store cannot be opened: {error}")


def _key_for_sglang_itself(server_args: ServerArgs, config: BatchApiConfig | None) -> str | None:
    """SGLang's warm-up calls its own routes with its ``--api-key`` alone. Once the key gate
    guards them (the Batch API is on and has keys), a server given keys but no ``--api-key``
    would refuse its own warm-up and stop; so SGLang gets a random key that only this process
    knows (None when it needs none)."""
    if config is None or server_args.api_key or not (config.api_keys or server_args.admin_api_key):
        return None
    server_args.api_key = secrets.token_urlsafe(32)
    return server_args.api_key


if __name__ == "__main__":
    main()
