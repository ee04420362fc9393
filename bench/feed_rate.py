"""Feed rate: how fast batch lines reach an engine whose forwards cost nothing, against SGLang's own
batched path on the same server, in the same run.

An emulated H100 (`sgl-blend serve --model llama-3.1-8b --emulate h100`, forwards returning at
once) leaves only the host's path to measure: tokenising, scheduling, detokenising and, for batch
lines, the runner. One server with the Batch API runs, in order:

1. **online alone**: Poisson chat requests (16 output tokens, non-streamed) at ``--online-rate``
   for ``--online-seconds``; each one's latency;
2. **ceiling**: the same ``--lines`` short prompts as one batched ``POST /generate`` (SGLang's own
   batched path, 16 tokens each): lines per second;
3. **Batch API**: the same ``--lines`` as short completion and chat lines (16 output tokens,
   ``ignore_eos``), two batches (a batch takes one endpoint) uploaded and created together with
   the official `openai` client; lines per second from the first ``create`` to the last
   ``completed``, while a prober reads ``GET /v1/batches/{id}`` at ``--status-rate`` and the same
   online traffic runs again;

then ``sgl-blend run-batch`` runs the same file on a server of its own (lines per second over the
job, from the server being ready to the job's end). Goals: both feeds at least 0.8x the ceiling;
status P99 at most 100 ms; online P99 during the batch at most 3x alone.

Writes ``bench/results/feed_rate_{LINES}.json`` and ``.png``.

    python -m bench.feed_rate --lines 4000
    python -m bench.feed_rate --lines 50000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.batch_load import plot_cdf, poisson, summary
from sgl_blend.emulation.launch import emulated_launch
from sgl_blend.jobs.fresh_server import run_on_fresh_server
from sgl_blend.jobs.run_batch import JobOptions
from sgl_blend.launch.colocation import with_free_port
from sgl_blend.launch.flags import with_defaults
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.sglang_plugin.settings import PluginSettings

RESULTS = Path(__file__).parent / "results"
MODEL, DEVICE = "llama-3.1-8b", "h100"
API_KEY = "sk-feed"
OUTPUT_TOKENS = 16
TOPICS = ("rivers", "volcanoes", "glaciers", "deserts", "forests", "oceans", "caves", "islands")
FINISHED = ("completed", "failed", "expired", "cancelled")
GOALS = {"feed_over_ceiling": 0.8, "status_p99_ms": 100.0, "online_p99_over_alone": 3.0}


def prompt(index: int) -> str:
    return f"Question {index}: in one sentence, what shapes {TOPICS[index % len(TOPICS)]}?"


def lines_file(count: int, urls: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")) -> bytes:
    """Short lines, completion and chat alternating (those of ``urls``), each ``OUTPUT_TOKENS`` long."""
    out = bytearray()
    for index in range(count):
        common = {"model": MODEL, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True}
        if index % 2:
            line = {"custom_id": f"line-{index}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {**common, "messages": [{"role": "user", "content": prompt(index)}]}}
        else:
            line = {"custom_id": f"line-{index}", "method": "POST", "url": "/v1/completions",
                    "body": {**common, "prompt": prompt(index)}}
        if line["url"] in urls:
            out += json.dumps(line).encode() + b"\n"
    return bytes(out)


def start(work: Path, lines: int) -> ServerProcess:
    launch = emulated_launch(DEVICE, MODEL, with_free_port(["--api-key", API_KEY, "--enable-cache-report"]))
    settings = launch.settings_for(PluginSettings())
    config = BatchApiConfig(data_dir=work / "data", max_file_lines=max(lines, 50_000), max_file_bytes=1 << 31)
    return start_server(str(launch.model_path), with_defaults(launch.sglang_args, settings.sglang_flags()),
                        log_path=work / "server.log", settings=settings, batch_api=config)


async def online(client: openai.AsyncOpenAI, rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson chat requests for ``seconds``; each one's latency."""
    latencies: list[float] = []

    async def one(index: int) -> None:
        began = time.monotonic()
        await client.chat.completions.create(model=MODEL, max_tokens=OUTPUT_TOKENS, extra_body={"ignore_eos": True},
                                             messages=[{"role": "user", "content": f"Online {prompt(index)}"}])
        latencies.append(time.monotonic() - began)

    await poisson(rate, seconds, seed, one)
    return latencies


async def ceiling(base_url: str, count: int) -> float:
    """Lines per second through one batched ``/generate`` of ``count`` prompts; the radix cache is
    flushed after it, so the batch that follows starts on an empty cache as this did."""
    body = {"text": [prompt(index) for index in range(count)],
            "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True}}
    async with httpx.AsyncClient(timeout=None, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        began = time.monotonic()
        response = await http.post(base_url + "/generate", json=body)
        seconds = time.monotonic() - began
        response.raise_for_status()
        (await http.post(base_url + "/flush_cache")).raise_for_status()
    return count / seconds


async def status_prober(client: openai.AsyncOpenAI, batch_ids: list[str], rate: float,
                        stop: asyncio.Event) -> list[float]:
    latencies: list[float] = []
    while not stop.is_set():
        began = time.monotonic()
        await client.batches.retrieve(batch_ids[len(latencies) % len(batch_ids)])
        latencies.append(time.monotonic() - began)
        await asyncio.sleep(max(0.0, 1 / rate - (time.monotonic() - began)))
    return latencies


async def server_phases(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=3600)
    alone = await online(client, args.online_rate, args.online_seconds, seed=1)
    ceiling_rate = await ceiling(server.base_url, args.lines)
    uploads = {url: await client.files.create(file=(f"feed{index}.jsonl", lines_file(args.lines, (url,))),
                                              purpose="batch")
               for index, url in enumerate(("/v1/completions", "/v1/chat/completions"))}
    began = time.monotonic()
    batches = [await client.batches.create(input_file_id=uploaded.id, endpoint=url, completion_window="24h")
               for url, uploaded in uploads.items()]
    stop = asyncio.Event()
    prober = asyncio.create_task(status_prober(client, [batch.id for batch in batches], args.status_rate, stop))
    during_task = asyncio.create_task(online(client, args.online_rate, args.online_seconds, seed=1))
    while any(batch.status not in FINISHED for batch in batches):
        await asyncio.sleep(0.2)
        batches = [await client.batches.retrieve(batch.id) for batch in batches]
    batch_seconds = time.monotonic() - began
    during = await during_task
    stop.set()
    status = await prober
    done = sum(batch.request_counts.completed for batch in batches)
    return {"online_alone": summary(alone), "ceiling_lines_per_s": round(ceiling_rate, 1),
            "batch_api": {"status": [batch.status for batch in batches], "completed": done,
                          "failed": sum(batch.request_counts.failed for batch in batches),
                          "seconds": round(batch_seconds, 2), "lines_per_s": round(done / batch_seconds, 1)},
            "status_latency": summary(status), "online_during": summary(during),
            "latencies": {"online_alone": alone, "online_during": during, "status": status}}


def run_batch_phase(work: Path, data: bytes) -> dict[str, Any]:
    source = work / "feed.jsonl"
    source.write_bytes(data)
    totals, _state = run_on_fresh_server(MODEL, "blendserve", source, work / "run-batch" / "out.jsonl",
                                         work / "run-batch" / "errors.jsonl", emulate=DEVICE,
                                         server_log=work / "run-batch" / "server.log",
                                         options=JobOptions(show_progress=False))
    return {"completed": totals.completed, "failed": totals.failed, "seconds": round(totals.wall_seconds, 2),
            "lines_per_s": round(totals.completed / totals.wall_seconds, 1)}


def judge(report: dict[str, Any]) -> dict[str, Any]:
    ceiling_rate = report["server"]["ceiling_lines_per_s"]
    api, job = report["server"]["batch_api"]["lines_per_s"], report["run_batch"]["lines_per_s"]
    status_p99 = report["server"]["status_latency"]["p99_ms"]
    alone, during = report["server"]["online_alone"]["p99_ms"], report["server"]["online_during"]["p99_ms"]
    return {"batch_api_over_ceiling": round(api / ceiling_rate, 3), "run_batch_over_ceiling": round(job / ceiling_rate, 3),
            "status_p99_ms": status_p99, "online_p99_over_alone": round(during / alone, 2),
            "met": {"batch_api": api >= GOALS["feed_over_ceiling"] * ceiling_rate,
                    "run_batch": job >= GOALS["feed_over_ceiling"] * ceiling_rate,
                    "status_p99": status_p99 <= GOALS["status_p99_ms"],
                    "online_p99": during <= GOALS["online_p99_over_alone"] * alone}}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, latency) = plt.subplots(1, 2, figsize=(11, 4))
    names = ["/generate (ceiling)", "Batch API", "run-batch"]
    values = [report["server"]["ceiling_lines_per_s"], report["server"]["batch_api"]["lines_per_s"],
              report["run_batch"]["lines_per_s"]]
    rates.bar(names, values, color=["grey", "tab:blue", "tab:orange"])
    rates.set_ylabel("lines per second")
    rates.set_title(f"{report['lines']:,} lines, emulated {DEVICE}, free forwards")
    for name, values in report["server"]["latencies"].items():
        plot_cdf(latency, values, name.replace("_", " "))
    latency.set_xscale("log")
    latency.set_xlabel("latency (ms)")
    latency.set_ylabel("fraction of requests")
    latency.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--online-rate", type=float, default=5.0, help="online chats per second (Poisson)")
    parser.add_argument("--online-seconds", type=float, default=20.0)
    parser.add_argument("--status-rate", type=float, default=5.0, help="GET /v1/batches/{id} per second")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sgl-blend-feed-rate"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or RESULTS / f"feed_rate_{args.lines}.json"
    shutil.rmtree(args.work, ignore_errors=True)  # a job left there would be answered as finished
    args.work.mkdir(parents=True)
    server = start(args.work / "serve", args.lines)
    try:
        server_report = asyncio.run(server_phases(server, args))
    finally:
        server.stop()
    report = {"lines": args.lines, "args": {key: str(value) for key, value in vars(args).items()},
              "server": server_report, "run_batch": run_batch_phase(args.work, lines_file(args.lines))}
    report["judged"] = judge(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out.with_suffix(".png"))
    print(json.dumps({key: value for key, value in report["server"].items() if key != "latencies"}
                     | {"run_batch": report["run_batch"], "judged": report["judged"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
