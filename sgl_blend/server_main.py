"""The SGLang HTTP server process that `sgl-blend serve` supervises.

It is SGLang's own ``launch_server`` on SGLang's own FastAPI app; sgl-blend only adds the Batch
and Files API routes to that app first, so batch and online traffic share one host and port.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from sgl_blend import cpu_compat


def main(argv: list[str] | None = None) -> None:
    cpu_compat.install()
    argv = list(sys.argv[1:] if argv is None else argv)
    blend_parser = argparse.ArgumentParser(add_help=False)
    _add_batch_arguments(blend_parser)
    blend_args, sglang_argv = blend_parser.parse_known_args(argv)

    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(sglang_argv)
    _install_batch_api(blend_args, server_args)
    from sglang.launch_server import run_server

    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def _add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from server.config import add_cli_arguments
    except ImportError:
        return
    add_cli_arguments(parser)


def _install_batch_api(blend_args: argparse.Namespace, server_args) -> None:
    try:
        from server import install_batch_api
        from server.config import config_from_args
    except ImportError:
        return
    from sglang.srt.entrypoints.http_server import app

    host = "127.0.0.1" if server_args.host in ("0.0.0.0", "::") else server_args.host
    config = config_from_args(blend_args, f"http://{host}:{server_args.port}")
    install_batch_api(app, dataclasses.replace(config, api_key=server_args.api_key))


if __name__ == "__main__":
    main()
