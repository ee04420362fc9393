"""Print the full commands for a multi-GPU (DP x TP) or multi-node deployment; optionally run the single-node one."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

NAME = "launch"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model name or HF model directory, as for serve")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs per node")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree; DP ranks = GPUS / TP")
    parser.add_argument(
        "--nodes",
        default="",
        metavar="HOST,...",
        help="several nodes: one server per host behind SGLang's router (default: this node only)",
    )
    parser.add_argument("--port", type=int, default=30000, help="each server's port")
    parser.add_argument("--router-port", type=int, default=8000, help="the router's port (several nodes)")
    parser.add_argument(
        "--batch-store", default="", metavar="URL", help="postgresql:// URL (required for several nodes)"
    )
    parser.add_argument(
        "--data-dir", default="", help="batch data directory (on a shared filesystem for several nodes)"
    )
    parser.add_argument(
        "--hardware", default="", help="cost-model device of one GPU (a100-80g, h100-sxm, h200, or a profile)"
    )
    parser.add_argument("--execute", action="store_true", help="run the single-node command instead of printing it")
    parser.set_defaults(accepts_extra_args=True)


def run(args: argparse.Namespace) -> int:
    from sgl_blend.launch.deployment import plan_launch

    nodes = tuple(node.strip() for node in args.nodes.split(",") if node.strip())
    try:
        plan = plan_launch(
            args.model,
            gpus=args.gpus,
            tp=args.tp,
            nodes=nodes,
            port=args.port,
            router_port=args.router_port,
            batch_store=args.batch_store,
            data_dir=args.data_dir,
            hardware=args.hardware,
            extra=tuple(args.extra_args),
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.execute:
        print(plan.script(), end="")
        return 0
    if nodes:
        print(
            "error: --execute runs the single-node command only; start each node's command on that node",
            file=sys.stderr,
        )
        return 2
    ((_title, argv),) = plan.steps
    executable = shutil.which(argv[0]) or argv[0]
    print(f"running: {' '.join(argv)}", file=sys.stderr, flush=True)
    os.execv(executable, argv)
    return 0
