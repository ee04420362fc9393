"""Find the largest co-location latency budget that keeps online latency within the SLOs (HyGen's profiler)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "tune-slo"
HELP = __doc__.splitlines()[0]
METRIC_FLAGS = ("ttft_mean", "ttft_p99", "tbt_mean", "tbt_p99")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--online-trace",
        type=Path,
        required=True,
        help='JSONL of {"t": seconds, "prompt": text, "max_tokens": n}, replayed on time',
    )
    parser.add_argument(
        "--offline-file",
        type=Path,
        required=True,
        help="OpenAI batch lines kept in flight as offline work during each replay",
    )
    for metric in METRIC_FLAGS:
        parser.add_argument(
            f"--{metric.replace('_', '-')}",
            default=None,
            metavar="SECONDS|baseline",
            help=f"SLO on online {metric.replace('_', ' ')}; 'baseline' = the online-only value",
        )
    parser.add_argument("--tolerance", type=float, default=0.05, help="allowed excess over each SLO (0.05 = 5%%)")
    parser.add_argument("--latency-model", type=Path, required=True, help="a `sgl-blend profile --latency` JSON")
    parser.add_argument("--latency-form", default=None, help="fitted form to use (default: the file's best)")
    parser.add_argument("--low-ms", type=float, default=1.0, help="smallest budget to consider")
    parser.add_argument("--high-ms", type=float, default=1000.0, help="largest budget to consider")
    parser.add_argument("--steps", type=int, default=6, help="bisection steps after checking both ends")
    parser.add_argument("--offline-concurrency", type=int, default=64, help="offline requests kept in flight")
    parser.add_argument(
        "--url", default=None, help="a running `sgl-blend serve` (any co-location mode); default: start one for --model"
    )
    parser.add_argument("--model", default="tiny-llama", help="model to serve when no --url is given")
    parser.add_argument("--out", type=Path, default=Path("slo.json"), help="where to store the result for serve")
    parser.set_defaults(accepts_extra_args=True)


def run(args: argparse.Namespace) -> int:
    requested = {metric: getattr(args, metric) for metric in METRIC_FLAGS if getattr(args, metric) is not None}
    try:
        settings = _checked(args, requested)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    trace, lines, model = settings
    from sgl_blend.core.colocation import ColocationConfig
    from sgl_blend.launch.colocation import colocation_launch, with_free_port
    from sgl_blend.launch.supervisor import ServerStartError, start_server
    from sgl_blend.measure.slo_profiler import tune_budget
    from sgl_blend.sglang_plugin.settings import PluginSettings

    server = None
    base_url = args.url
    if base_url is None:
        plugin_settings = PluginSettings(colocation=ColocationConfig(mode="hygen", latency_model=model))
        sglang_args = colocation_launch(plugin_settings, with_free_port(args.extra_args))
        try:
            server = start_server(
                args.model, sglang_args, settings=plugin_settings, log_path=args.out.with_suffix(".server.log")
            )
        except (ServerStartError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        base_url = server.base_url
    try:
        result = tune_budget(
            base_url,
            trace,
            lines,
            requested,
            model,
            tolerance=args.tolerance,
            low_s=args.low_ms / 1000,
            high_s=args.high_ms / 1000,
            steps=args.steps,
            concurrency=args.offline_concurrency,
        )
    except (RuntimeError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
    for step in result["steps"]:
        verdict = "violates " + ", ".join(step["violated"]) if step["violated"] else "meets all SLOs"
        print(
            f"budget {step['budget_s'] * 1000:8.2f} ms: {verdict}; "
            + ", ".join(f"{name} {step['metrics'][name] * 1000:.1f} ms" for name in requested)
            + f"; offline {step['metrics']['offline_tokens_per_s']:.1f} tok/s"
        )
    if result["latency_budget_s"] is None:
        print(f"error: even {args.low_ms} ms violates {', '.join(result['binding'])}; nothing stored", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"latency budget {result['latency_budget_s'] * 1000:.2f} ms"
        + (f" (binding: {', '.join(result['binding'])})" if result["binding"] else "")
        + f" -> {args.out}; "
        f"use it with `sgl-blend serve --colocation hygen --slo-file {args.out}`"
    )
    return 0


def _checked(args: argparse.Namespace, requested: dict[str, str]):
    """Everything that can be wrong with the inputs, found before any server starts."""
    from sgl_blend.batch_lines.lines import BatchLine, read_lines
    from sgl_blend.core.latency_model import load_model
    from sgl_blend.measure.online_replay import load_trace

    if not requested:
        raise ValueError("give at least one SLO: --ttft-p99, --ttft-mean, --tbt-p99 or --tbt-mean")
    if not 0 < args.low_ms < args.high_ms:
        raise ValueError(f"need 0 < --low-ms < --high-ms, got {args.low_ms} and {args.high_ms}")
    if args.tolerance < 0 or args.steps < 0:
        raise ValueError("--tolerance and --steps must not be negative")
    try:
        model = load_model(args.latency_model, args.latency_form).to_dict()
        trace = load_trace(args.online_trace)
        lines = list(read_lines(args.offline_file))
    except OSError as error:
        raise ValueError(str(error)) from None
    bad = [line for line in lines if not isinstance(line, BatchLine)]
    if bad:
        raise ValueError(f"{args.offline_file}: line {bad[0].line_number}: {bad[0].message}")
    if not trace or not lines:
        raise ValueError("the online trace and the offline file must not be empty")
    return trace, lines, model
