"""The main job end to end: start smollm2-135m, answer a chat request, then run a demo batch through the Batch API."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

NAME = "demo"
HELP = __doc__.splitlines()[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--work-dir", type=Path, default=Path("demo-output"), help="where outputs and logs go")
    parser.add_argument("--batch-lines", type=int, default=12, help="lines in the demo batch (0: chat only)")


def run(args: argparse.Namespace) -> int:
    from sgl_blend.client.batches import connect
    from sgl_blend.launch.supervisor import ServerStartError, start_server
    from sgl_blend.server.config import BatchApiConfig

    args.work_dir.mkdir(parents=True, exist_ok=True)
    log = args.work_dir / "server.log"
    print(f"[demo] starting {args.model} on port {args.port} (log: {log})", flush=True)
    start = time.monotonic()
    try:
        server = start_server(
            args.model,
            ["--port", str(args.port), "--enable-cache-report"],
            log_path=log,
            batch_api=BatchApiConfig(data_dir=args.work_dir / "batch-data"),
        )
    except (ServerStartError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    try:
        print(f"[demo] server ready in {time.monotonic() - start:.1f} s at {server.base_url}", flush=True)
        client = connect(server.base_url, server.api_key)
        question = "What is the capital of France?"
        answer = (
            client.chat.completions.create(
                model=args.model, messages=[{"role": "user", "content": question}], max_tokens=48, temperature=0
            )
            .choices[0]
            .message.content
        )
        print(f"[demo] chat> {question}\n[demo] {args.model}> {answer}", flush=True)
        if args.batch_lines:
            from sgl_blend.jobs.demo import demo_lines, run_demo_batch

            run_demo_batch(client, args.work_dir, demo_lines(args.batch_lines))
    finally:
        server.stop()
    return 0
