"""Measure this device and write a cost-model hardware profile, or (--latency) fit the batch-latency models."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "profile"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON to write (default hw.json, or latency-model.json with --latency)"
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present, else cpu)")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller shapes")
    latency = parser.add_argument_group("batch latency (co-location)")
    latency.add_argument(
        "--latency",
        action="store_true",
        help="run a grid of batch compositions through a live server and fit the HyGen, Echo "
        "and BROS latency models; report each one's MAPE on held-out batches",
    )
    latency.add_argument("--model", default="tiny-llama", help="model to serve for --latency")
    latency.add_argument("--repeats", type=int, default=1, help="passes over the grid (--latency)")
    latency.add_argument("--seed", type=int, default=0)
    parser.set_defaults(accepts_extra_args=True)


def run(args: argparse.Namespace) -> int:
    if args.latency:
        return _run_latency(args)
    if args.extra_args:
        print(f"error: unrecognized arguments: {' '.join(args.extra_args)}")
        return 2
    from sgl_blend.kernels.profile import format_table, run_profile

    out = args.out or Path("hw.json")
    report = run_profile(out, args.device, args.quick)
    spec = report["hardware"]
    print(
        f"{spec.name}: {spec.flops / 1e12:.3f} TFLOP/s, {spec.bandwidth / 1e9:.1f} GB/s, "
        f"KV memory {spec.kv_memory_bytes / 2**30:.1f} GiB -> {out}"
    )
    print(format_table(report["table"]))
    return 0


def _run_latency(args: argparse.Namespace) -> int:
    import sys

    from sgl_blend.launch.supervisor import ServerStartError
    from sgl_blend.measure.latency_profile import format_report, profile_latency

    if args.repeats < 1:
        print("error: --repeats must be at least 1", file=sys.stderr)
        return 2
    out = args.out or Path("latency-model.json")
    try:
        result = profile_latency(
            args.model, out, quick=args.quick, repeats=args.repeats, seed=args.seed, sglang_args=args.extra_args
        )
    except (ServerStartError, FileNotFoundError, RuntimeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(format_report(result))
    print(f"-> {out} (per-iteration records: {result['records']})")
    return 0
