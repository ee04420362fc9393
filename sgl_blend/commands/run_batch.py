"""Run an OpenAI batch file offline through a local server; resumable, with a progress bar.

The job is run by the Batch API's own runner inside the server it starts, over a store beside the
output (`sgl_blend.jobs.run_batch`), so a re-run of the same command resumes it."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

NAME = "run-batch"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sgl_blend.batch_lines.lines import DEFAULT_MAX_LINE_BYTES
    from sgl_blend.core.policy_registry import RUN_BATCH, describe, names_for
    from sgl_blend.emulation.config import REALTIME_HELP

    parser.add_argument("-i", "--input", type=Path, required=True, help="input JSONL (OpenAI batch line format)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="output JSONL (appended; resumable)")
    parser.add_argument(
        "--error-file", type=Path, default=None, help="error JSONL (default: OUTPUT with .errors.jsonl)"
    )
    parser.add_argument("--model", required=True, help="tiny-llama, smollm2-135m, or a model path")
    parser.add_argument(
        "--policy", choices=names_for(RUN_BATCH), default="blendserve", help="offline order: " + describe(RUN_BATCH)
    )
    parser.add_argument("--hardware", default=None, help="hardware profile for the cost model (name or hw.json)")
    parser.add_argument(
        "--emulate",
        default=None,
        metavar="DEVICE",
        help="run on an emulated GPU (h100, a100-80g, or a profile JSON): SGLang runs for real, each "
        "forward is priced at --model's shapes (llama-3.1-8b, llama-3.1-70b) and the summary "
        "reports the job's time on that device",
    )
    parser.add_argument("--emulate-realtime", type=float, default=None, metavar="FACTOR", help=REALTIME_HELP)
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=None,
        help="lines handed to the scheduler at once, per DP rank (default: twice the requests it runs "
        "at once, from its KV pool and running limit)",
    )
    parser.add_argument(
        "--max-line-bytes",
        type=int,
        default=DEFAULT_MAX_LINE_BYTES,
        help="longest line that runs (a longer one fails alone, in the error file)",
    )
    parser.add_argument("--server-log", type=Path, default=None, help="where the server's output goes")
    parser.add_argument("--summary-json", type=Path, default=None, help="also write the summary here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(accepts_extra_args=True)


def _stop_like_ctrl_c(_signum: int, _frame: object) -> None:
    """SIGTERM ends the job as Ctrl-C does: finished lines kept, the server stopped, never orphaned.
    Raised as SIGINT, so the job's event loop stops the way it stops for Ctrl-C."""
    signal.raise_signal(signal.SIGINT)


def run(args: argparse.Namespace) -> int:
    from sgl_blend.jobs.fresh_server import run_on_fresh_server
    from sgl_blend.jobs.run_batch import JobOptions, JobRefused
    from sgl_blend.launch.supervisor import ServerStartError

    if not args.input.is_file():
        print(f"error: no input file {args.input}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop_like_ctrl_c)
    # Ctrl-C must stop the job even when a launcher started it with SIGINT ignored (a shell's `&`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    error_path = args.error_file or args.output.with_suffix(".errors.jsonl")
    server_log = args.server_log or args.output.with_suffix(".server.log")

    def announce(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        totals, state = run_on_fresh_server(
            args.model,
            args.policy,
            args.input,
            args.output,
            error_path,
            sglang_args=args.extra_args,
            hardware=args.hardware,
            server_log=server_log,
            emulate=args.emulate,
            emulate_realtime=args.emulate_realtime,
            announce=announce,
            options=JobOptions(args.max_inflight, args.max_line_bytes, show_progress=not args.no_progress),
        )
    except (ServerStartError, FileNotFoundError, ValueError, JobRefused) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: finished lines are saved; run the same command again to resume", file=sys.stderr)
        return 130
    if totals.already_finished:
        print(
            f"the job was already finished ({totals.skipped} lines); its results are in {args.output} and {error_path}",
            file=sys.stderr,
        )
    if totals.not_run:
        print(
            f"{totals.not_run} lines did not run (the engine went away); run the same command again to run them",
            file=sys.stderr,
        )
    offline = state.get("offline") or {}
    summary = {
        "policy": args.policy,
        "output": str(args.output),
        "errors": str(error_path),
        **totals.summary(),
        "scheduler": {key: offline[key] for key in ("counts", "plan_seconds") if key in offline},
    }
    print(json.dumps(summary, indent=2))
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if totals.not_run else 0
