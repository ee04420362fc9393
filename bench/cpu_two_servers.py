"""One batch on one local tiny-llama server, then on two (a coordinator and a worker on loopback,
the lines spread by BlendServe's partition): batch wall time and the ratio, measured on this
machine. On a machine with fewer cores than two servers can keep busy the second server only
competes for the same cores, so the figure says what this machine does, not what two GPUs do.

    python -m bench.cpu_two_servers --lines 96
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from sgl_blend.workloads.batch_files import fewshot_lines, write_jsonl
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.client.batches import submit, wait
from sgl_blend.launch.colocation import free_port
from sgl_blend.launch.supervisor import start_server

RESULTS = Path(__file__).parent / "results"


def run_batch(work: Path, lines: list[dict], workers: int) -> dict[str, Any]:
    """Start ``workers`` servers (the first coordinates), run the batch, stop them; its timing."""
    work.mkdir(parents=True, exist_ok=True)
    others = [start_server("tiny-llama", ["--port", str(free_port())], log_path=work / f"worker{index}.log")
              for index in range(1, workers)]
    config = BatchApiConfig(data_dir=work / "data", workers=tuple(server.base_url for server in others))
    coordinator = start_server("tiny-llama", ["--port", str(free_port()), "--enable-cache-report"],
                               log_path=work / "coordinator.log", batch_api=config)
    try:
        client = openai.OpenAI(base_url=f"{coordinator.base_url}/v1", api_key="unused", max_retries=0)
        start = time.monotonic()
        batch = wait(client, submit(client, write_jsonl(work / "batch.jsonl", lines)).id, poll_s=0.2)
        seconds = time.monotonic() - start
    finally:
        for server in (coordinator, *others):
            server.stop()
    usage = batch.usage
    return {"servers": workers, "status": batch.status, "completed": batch.request_counts.completed,
            "seconds": round(seconds, 2), "output_tokens": usage.output_tokens if usage else None,
            "output_tokens_per_s": round(usage.output_tokens / seconds, 1) if usage else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=96)
    parser.add_argument("--out", type=Path, default=RESULTS / "cpu_two_servers.json")
    args = parser.parse_args()
    lines = fewshot_lines(n=args.lines, groups=4, chat=True)
    for line in lines:
        line["body"]["max_tokens"] = min(line["body"]["max_tokens"], 32)
    with tempfile.TemporaryDirectory(prefix="sgl-blend-two-servers-") as root:
        one = run_batch(Path(root) / "one", lines, 1)
        two = run_batch(Path(root) / "two", lines, 2)
    report = {"lines": args.lines, "cpu_cores": len(os.sched_getaffinity(0)), "load_average_at_end": os.getloadavg(),
              "one_server": one, "two_servers": two, "speedup": round(one["seconds"] / two["seconds"], 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
