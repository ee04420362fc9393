"""Price a batch file before running it: predicted job time, the T_o bound and prompt tokens saved by sharing, per order."""  # noqa: E501 - the first line is the --help summary

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sgl_blend.core.policy_registry import SIM, lookup

NAME = "estimate"
HELP = __doc__.splitlines()[0]
DEFAULT_POLICIES = "blendserve,lpm"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--input", type=Path, required=True, help="an OpenAI batch file (the run-batch format)")
    parser.add_argument(
        "--model",
        default="llama-3.1-8b",
        help="llama-3.1-8b, llama-3.1-70b, or an HF model directory: its shapes price the job and its "
        "tokenizer (the stand-in's for an emulated model) reads the prompts",
    )
    parser.add_argument(
        "--device",
        default="h100",
        help="h100, a100-80g, or a profile JSON naming its memory: the engine is sized as a stock "
        "SGLang server on it, as run-batch --emulate sizes it",
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    parser.add_argument(
        "--hardware",
        default=None,
        help="price forwards with this profile (name or hw.json) instead of the device's own spec",
    )
    parser.add_argument(
        "--policy",
        default=DEFAULT_POLICIES,
        help="comma-separated orders to price, the first compared with the rest "
        "(lpm is SGLang's own: first-come-first-served while more than 128 requests wait)",
    )
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=None,
        help="cap on lines in flight, as run-batch's (default: the runner's window)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from sgl_blend.core.cost_model import HardwareSpec
    from sgl_blend.sim.batch_file import load_batch_file
    from sgl_blend.sim.estimate import estimate, table
    from sgl_blend.sim.sizing import stock_engine

    policies = args.policy.split(",")
    try:
        for name in policies:
            lookup(name, SIM)
        engine = stock_engine(
            args.model, args.device, args.tp, hardware=HardwareSpec.resolve(args.hardware) if args.hardware else None
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.input.is_file():
        print(f"error: {args.input} is not a file", file=sys.stderr)
        return 2
    batch = load_batch_file(args.input, args.model)
    if not batch.requests:
        print(f"error: {args.input} has no runnable line", file=sys.stderr)
        return 1
    report = {
        "file": str(args.input),
        "device": args.device,
        "tp": args.tp,
        "invalid_lines": batch.invalid,
        "lines_without_max_tokens": batch.unbounded,
        **estimate(batch.requests, engine, policies, window=args.max_inflight),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(table(report))
    if batch.invalid:
        print(f"{batch.invalid} lines would fail and are not priced")
    if batch.unbounded:
        print(f"{batch.unbounded} lines set no max_tokens and are priced at the planner's fallback bound")
    return 0
