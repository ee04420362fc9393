"""Measure this device's achievable FLOP/s and bandwidth and write a cost-model hardware profile."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "profile"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("hw.json"), help="profile JSON to write")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present, else cpu)")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller shapes")


def run(args: argparse.Namespace) -> int:
    from kernels.profile import format_table, run_profile

    report = run_profile(args.out, args.device, args.quick)
    spec = report["hardware"]
    print(f"{spec.name}: {spec.flops / 1e12:.3f} TFLOP/s, {spec.bandwidth / 1e9:.1f} GB/s, "
          f"KV memory {spec.kv_memory_bytes / 2**30:.1f} GiB -> {args.out}")
    print(format_table(report["table"]))
    return 0
