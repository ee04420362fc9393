"""Start SGLang's HTTP server with the plugin and the Batch API (every other SGLang flag passes through)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from sgl_blend.core.policy_registry import SERVE, describe, lookup, names_for
from sgl_blend.core.policy_worker import WORKER_KINDS
from sgl_blend.launch.colocation_flags import add_colocation_arguments

NAME = "serve"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sgl_blend.batch_lines.bodies import DEFAULT_MAX_N, DEFAULT_MAX_TOKENS
    from sgl_blend.emulation.config import REALTIME_HELP
    from sgl_blend.server.config import (
        DEFAULT_MAX_FILE_BYTES,
        DEFAULT_MAX_FILE_LINES,
        DEFAULT_MAX_LINE_BYTES,
        DEFAULT_WORKER_GRACE_S,
        default_data_dir,
    )

    parser.add_argument("--model", required=True, help="tiny-llama, smollm2-135m, or a path to an HF model directory")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where bundled models are built")
    parser.add_argument("--log-file", type=Path, default=None, help="write the server's output here")
    parser.add_argument(
        "--detach",
        action="store_true",
        help="return once /health is 200 and leave the server running (prints its pid); without it the "
        "server dies with this command, however it dies (kill -9 included)",
    )
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /health")
    parser.add_argument(
        "--offline-policy",
        choices=names_for(SERVE),
        default="blendserve",
        help="order of offline work (batch lines) in the scheduler: " + describe(SERVE),
    )
    parser.add_argument(
        "--policy-worker",
        choices=WORKER_KINDS,
        default="process",
        help="where the offline policy plans, one step ahead of SGLang's scheduler loop: a child process "
        "of each scheduler (default), a thread of it, or inline in the loop",
    )
    parser.add_argument(
        "--hardware",
        default=None,
        help="cost-model hardware: a built-in name (a100-80g, h100-sxm, h200, cpu; default cpu "
        "without CUDA) or an `sgl-blend profile` JSON",
    )
    parser.add_argument(
        "--emulate",
        default=None,
        metavar="DEVICE",
        help="emulate a GPU (h100, a100-80g, or a profile JSON with its memory): SGLang runs for "
        "real but the model forward is skipped and priced; --model may then be llama-3.1-8b or "
        "llama-3.1-70b and --tp-size is priced, not run. `cpu` runs the real forward and prices "
        "it beside",
    )
    parser.add_argument("--emulate-realtime", type=float, default=None, metavar="FACTOR", help=REALTIME_HELP)
    batch = parser.add_argument_group("Batch API (/v1/files, /v1/batches)")
    batch.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"where batch files and the SQLite store live (default {default_data_dir()}, or $SGLBLEND_DATA_DIR)",
    )
    batch.add_argument(
        "--batch-store",
        default="",
        metavar="URL",
        help="a postgresql:// URL to share the batch store between servers (default: SQLite in --data-dir)",
    )
    batch.add_argument(
        "--max-file-lines", type=int, default=DEFAULT_MAX_FILE_LINES, help="most requests in one batch input file"
    )
    batch.add_argument(
        "--max-file-bytes",
        type=int,
        default=DEFAULT_MAX_FILE_BYTES,
        help="largest upload accepted (a bigger one gets 413)",
    )
    batch.add_argument(
        "--max-line-bytes",
        type=int,
        default=DEFAULT_MAX_LINE_BYTES,
        help="longest batch line that runs (a longer one fails alone, in the error file)",
    )
    batch.add_argument(
        "--batch-max-inflight",
        type=int,
        default=None,
        help="batch lines in flight at once per DP rank, across all batches (default: twice the "
        "requests the scheduler runs at once, from its KV pool and running limit)",
    )
    batch.add_argument(
        "--batch-workers",
        type=_urls,
        default=(),
        metavar="URL,...",
        help="other sgl-blend/SGLang servers (base URLs, same model and --api-key) that this server's "
        "batch runner also sends lines to, spread by BlendServe's DP partition",
    )
    batch.add_argument(
        "--worker-grace",
        type=float,
        default=DEFAULT_WORKER_GRACE_S,
        metavar="SECONDS",
        help="how long a batch worker may stay unreachable before its unfinished lines move to the others",
    )
    batch.add_argument(
        "--batch-api-keys",
        type=_keys,
        default=(),
        metavar="KEY,...",
        help="keys the Batch API takes beside SGLang's --api-key; files and batches belong to the key "
        "that created them and another key gets 404 for them; --admin-api-key sees all",
    )
    batch.add_argument(
        "--batch-api-keys-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="more Batch API keys, one per line (blank lines and # comments ignored), kept out of the process list",
    )
    batch.add_argument(
        "--batch-cors-origins",
        type=_origins,
        default=(),
        metavar="ORIGIN,...",
        help="web origins (https://app.example.com, or *) whose pages may call the Batch API from a "
        "browser; every other browser request to it is refused with 403 (default: none)",
    )
    batch.add_argument(
        "--batch-max-n",
        type=_positive,
        default=DEFAULT_MAX_N,
        metavar="N",
        help="most choices one batch line may ask for (n, best_of); a line over it fails alone",
    )
    batch.add_argument(
        "--batch-max-tokens",
        type=_positive,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help="longest generation one batch line may ask for (max_tokens, max_completion_tokens); "
        "a line over it fails alone",
    )
    batch.add_argument("--no-batch-api", action="store_true", help="serve without the Files and Batches routes")
    add_colocation_arguments(parser)
    parser.set_defaults(accepts_extra_args=True)


def _urls(text: str) -> tuple[str, ...]:
    urls = tuple(url.strip().rstrip("/") for url in text.split(",") if url.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise argparse.ArgumentTypeError(f"{url!r} is not a base URL like http://host:port")
    return urls


def _keys(text: str) -> tuple[str, ...]:
    return tuple(key.strip() for key in text.split(",") if key.strip())


def _origins(text: str) -> tuple[str, ...]:
    origins = tuple(origin.strip().rstrip("/") for origin in text.split(",") if origin.strip())
    for origin in origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise argparse.ArgumentTypeError(f"{origin!r} is not a web origin like https://host[:port], nor *")
    return origins


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def keys_from_file(path: Path) -> tuple[str, ...]:
    """The keys in a keys file: one per line, blank lines and ``#`` comments ignored. Raises
    OSError when it cannot be read and ValueError when a key holds a space or a comma."""
    keys = tuple(line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    keys = tuple(key for key in keys if key)
    if any(" " in key or "," in key for key in keys):
        raise ValueError(f"{path}: a key may not hold a space or a comma")
    return keys


def batch_api_config(args: argparse.Namespace):
    """The Batch API configuration the flags ask for, or None for ``--no-batch-api``. Raises
    OSError or ValueError for an unreadable keys file."""
    from sgl_blend.server.config import BatchApiConfig, default_data_dir

    if args.no_batch_api:
        return None
    keys = args.batch_api_keys + (keys_from_file(args.batch_api_keys_file) if args.batch_api_keys_file else ())
    return BatchApiConfig(
        data_dir=args.data_dir or default_data_dir(),
        store_url=args.batch_store,
        max_file_lines=args.max_file_lines,
        max_file_bytes=args.max_file_bytes,
        max_line_bytes=args.max_line_bytes,
        max_inflight=args.batch_max_inflight,
        workers=args.batch_workers,
        worker_grace_s=args.worker_grace,
        api_keys=keys,
        cors_origins=args.batch_cors_origins,
        max_n=args.batch_max_n,
        max_tokens=args.batch_max_tokens,
    )


def run(args: argparse.Namespace) -> int:
    from sgl_blend.launch.colocation_flags import colocation_server_settings
    from sgl_blend.launch.flags import with_defaults
    from sgl_blend.launch.supervisor import ServerStartError, serve_forever, start_server
    from sgl_blend.sglang_plugin.settings import PluginSettings

    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    settings = PluginSettings(
        offline_policy=lookup(args.offline_policy, SERVE).name,
        hardware=args.hardware or None,
        policy_worker=args.policy_worker,
    )
    try:
        batch_api = batch_api_config(args)
    except (OSError, ValueError) as error:
        print(f"error: --batch-api-keys-file: {error}", file=sys.stderr)
        return 2
    # A batch's usage reports cached prompt tokens only when SGLang reports them per request.
    sglang_args = with_defaults(args.extra_args, (("--enable-cache-report", None),) if batch_api else ())
    try:
        settings = colocation_server_settings(args, settings)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model = args.model
    if args.emulate:
        from sgl_blend.emulation.launch import emulated_launch

        try:
            launch = emulated_launch(
                args.emulate, args.model, sglang_args, cache_dir=args.cache_dir, realtime_factor=args.emulate_realtime
            )
        except (ValueError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        model, sglang_args, settings = str(launch.model_path), launch.sglang_args, launch.settings_for(settings)
        print(f"sgl-blend: {launch.describe()}", flush=True)
    sglang_args = with_defaults(sglang_args, settings.sglang_flags())
    try:
        server = start_server(
            model,
            sglang_args,
            cache_dir=args.cache_dir,
            log_path=args.log_file,
            ready_timeout_s=args.ready_timeout,
            settings=settings,
            batch_api=batch_api,
            outlive=args.detach,
        )
    except (ServerStartError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    where = f"; batch data in {batch_api.data_dir}" if batch_api and not batch_api.store_url else ""
    print(f"sgl-blend: serving {args.model} at {server.base_url} (pid {server.process.pid}){where}", flush=True)
    if args.detach:
        return 0
    return serve_forever(server)
