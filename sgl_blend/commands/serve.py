"""Start SGLang's HTTP server with the sgl-blend plugin (every other SGLang flag passes through)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from sgl_blend.colocation_cli import add_colocation_arguments

NAME = "serve"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="tiny-llama, smollm2-135m, or a path to an HF model directory")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where bundled models are built")
    parser.add_argument("--log-file", type=Path, default=None, help="write the server's output here")
    parser.add_argument("--detach", action="store_true",
                        help="return once /health is 200 and leave the server running (prints its pid)")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /health")
    parser.add_argument("--offline-policy", choices=("blendserve", "dfs", "fcfs", "random", "psm", "off"),
                        default="blendserve", help="order of offline work (batch lines) in the scheduler")
    parser.add_argument("--hardware", default=None,
                        help="cost-model hardware: a built-in name (a100-80g, h100-sxm, h200) or an `sgl-blend profile` JSON")
    add_colocation_arguments(parser)
    parser.set_defaults(accepts_extra_args=True)


def run(args: argparse.Namespace) -> int:
    from sgl_blend.colocation_cli import colocation_server_settings
    from sgl_blend.serve import ServerStartError, serve_forever, start_server

    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    from sgl_blend.sglang_plugin.scheduler_hooks import HARDWARE_ENV, POLICY_ENV

    env = {POLICY_ENV: args.offline_policy, **({HARDWARE_ENV: args.hardware} if args.hardware else {})}
    try:
        sglang_args, colocation_env = colocation_server_settings(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    env.update(colocation_env)
    try:
        server = start_server(args.model, sglang_args, cache_dir=args.cache_dir, log_path=args.log_file,
                              ready_timeout_s=args.ready_timeout, extra_env=env)
    except (ServerStartError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"sgl-blend: serving {args.model} at {server.base_url} (pid {server.process.pid})", flush=True)
    if args.detach:
        return 0
    return serve_forever(server)
