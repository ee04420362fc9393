"""The `sgl-blend` command. Each subcommand is a module in `sgl_blend.commands`.

A command module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.
Modules are imported only to build the parser; heavy imports (torch, sglang) live inside ``run``
so that ``sgl-blend --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from sgl_blend import __version__, commands, cpu_compat


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgl-blend", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"sgl-blend {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        sub = subparsers.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    cpu_compat.install()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_extra_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra_args = extra
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
