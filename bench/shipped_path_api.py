"""BlendServe through the Batch API on an emulated H100: the shipped path users reach with the
`openai` client, at the same workloads as `bench.shipped_path`.

For each workload and policy a fresh `sgl-blend serve --emulate h100 --model llama-3.1-8b` runs the
file split three ways: two batches submitted together, and a third submitted once the first two
have a quarter of their lines done, so it joins a plan under way. Job time is the emulated
device's from the first ``create`` to the last batch's ``completed`` (the priced forwards plus the
time the engine had nothing to run). Results go beside `bench.shipped_path`'s, judged the same way.

    python -m bench.shipped_path_api --lines 4000 --workloads trace1,trace2
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai

from bench.shipped_path import DEVICE, GRID, MODEL, POLICIES, REALTIME_FACTOR, RESULTS, TRACES, run_grid
from sgl_blend.client import http
from sgl_blend.emulation.clock_reader import job_time, read_clock
from sgl_blend.launch.colocation import free_port

API_KEY = "sk-bench"
JOIN_AFTER = 0.25
POLL_S = 0.5
# Generous: under --lock the server starts only when the machine is free.
READY_TIMEOUT_S = 3 * 3600


def serve(policy: str, work: Path, port: int, lock: Path | None, realtime: float | None) -> subprocess.Popen:
    """`sgl-blend serve` for one policy, waited on until it answers."""
    command = [*(["flock", str(lock)] if lock else []), sys.executable, "-m", "sgl_blend.cli", "serve",
               "--model", MODEL, "--emulate", DEVICE, "--offline-policy", policy, "--port", str(port),
               "--api-key", API_KEY, "--data-dir", str(work / "data"), "--log-file", str(work / "server.log"),
               *(["--emulate-realtime", str(realtime)] if realtime else [])]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"serve for {policy} exited with {server.returncode}; see {work / 'server.log'}")
        try:
            http.server_info(f"http://127.0.0.1:{port}", API_KEY, timeout=5)
            return server
        except Exception:
            time.sleep(1.0)
    raise RuntimeError(f"serve for {policy} did not answer within {READY_TIMEOUT_S} s")


def run(policy: str, batch_file: Path, work: Path, lock: Path | None, realtime: float | None) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    lines = batch_file.read_bytes().splitlines(keepends=True)
    parts = [b"".join(lines[index::3]) for index in range(3)]
    port = free_port()
    server = serve(policy, work, port, lock, realtime)
    base_url = f"http://127.0.0.1:{port}"
    try:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0)
        files = [client.files.create(file=(f"part{index}.jsonl", data), purpose="batch").id
                 for index, data in enumerate(parts)]
        started, before = time.monotonic(), read_clock(base_url, API_KEY)

        def create(file_id: str) -> str:
            return client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h").id

        batches = [create(files[0]), create(files[1])]
        joined_at = None
        while True:
            current = [client.batches.retrieve(batch_id) for batch_id in batches]
            first_two = current[:2]
            done = sum(batch.request_counts.completed + batch.request_counts.failed for batch in first_two)
            total = sum(batch.request_counts.total for batch in first_two)
            if len(batches) == 2 and total and done >= JOIN_AFTER * total:
                batches.append(create(files[2]))
                joined_at = round(time.monotonic() - started, 1)
            if len(batches) == 3 and all(batch.status in ("completed", "failed", "expired", "cancelled")
                                         for batch in current):
                break
            time.sleep(POLL_S)
        emulated = job_time(before, read_clock(base_url, API_KEY))
        wall = time.monotonic() - started
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()
    prompt = sum(batch.usage.input_tokens for batch in current)
    output = sum(batch.usage.output_tokens for batch in current)
    cached = sum(batch.usage.input_tokens_details.cached_tokens for batch in current)
    return {"status": [batch.status for batch in current],
            "completed": sum(batch.request_counts.completed for batch in current),
            "failed": sum(batch.request_counts.failed for batch in current),
            "prompt_tokens": prompt, "completion_tokens": output, "cached_tokens": cached,
            "seconds": round(emulated.seconds, 3), "idle_seconds": round(emulated.idle_seconds, 3),
            "device_seconds": round(emulated.device_seconds, 3), "late_seconds": round(emulated.late_seconds, 3),
            "seconds_with_lateness": round(emulated.seconds_with_lateness, 3), "wall_seconds": round(wall, 1),
            "tokens_per_s": round((prompt + output) / emulated.seconds, 1), "third_joined_at_wall_s": joined_at}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--workloads", default=",".join(TRACES + GRID))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--lock", type=Path, default=None, help="flock this file around each run (shared machine)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=Path("/tmp/sgl-blend-shipped-path-api"))
    parser.add_argument("--realtime", type=float, default=REALTIME_FACTOR, help="serve --emulate-realtime (0: off)")
    args = parser.parse_args(argv)
    out = args.out or RESULTS / f"shipped_path_api_{args.lines}.json"
    realtime = args.realtime or None
    run_grid(args, out, lambda policy, batch_file, work: run(policy, batch_file, work, args.lock, realtime))
    return 0


if __name__ == "__main__":
    sys.exit(main())
