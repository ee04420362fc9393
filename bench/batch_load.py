"""Batch API under load: two large batches beside Poisson online traffic, and the Batch API's memory
as a batch grows from 50K to 500K lines.

Three fresh tiny-llama servers on this CPU (the same flags each):

1. **Online-only, then loaded.** Poisson online chat requests (streamed; TTFT is the first token's
   arrival) at ``--online-rate`` for ``--online-seconds`` on an idle server; then two batches of
   ``--lines`` lines each are uploaded and created with the official `openai` client and the same
   online traffic runs again while they run, with an API prober beside it (retrieve, list batches,
   list files, at ``--api-rate``). Judged: online P99 TTFT within 10% of online-only; Batch API
   P99 latency under 200 ms.
2. **Memory: 50K vs 500K lines.** One batch of ``--lines`` lines, then (on another fresh server) one
   of ``--big-lines``, each followed until ``--memory-done`` lines are answered (validation,
   planning and feeding all under way), then cancelled. Judged: the server process's peak resident
   memory (the kernel's ``VmHWM`` of the process that holds the Batch API) flat from one to the
   other (within 10%).

Why the CPU engine and not the emulated GPU (``--emulate h100``): the emulated engine skips each
forward and prices it on a clock of its own, so a client's wall-clock TTFT there measures only the
host's scheduling, not the device's contention between online and offline work; here prefill and
decode really take the time they take. The API latency and the memory are the Batch API's own and
do not depend on the engine.

Writes ``bench/results/batch_load.json`` and ``batch_load.png``.

    python -m bench.batch_load --lines 50000 --big-lines 500000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import openai
import psutil

from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.server.config import BatchApiConfig

RESULTS = Path(__file__).parent / "results"
API_KEY = "sk-load"
FAMILIES = 64
TOPICS = ("rivers", "volcanoes", "glaciers", "deserts", "forests", "oceans", "caves", "islands")
FINISHED = ("completed", "failed", "expired", "cancelled")


def batch_file(lines: int, tag: str) -> bytes:
    """Chat lines in prefix families (a shared system prompt each), outputs of 2-8 tokens."""
    rng = random.Random(tag)
    out = bytearray()
    for index in range(lines):
        family = rng.randrange(FAMILIES)
        system = f"You are a terse tutor on {TOPICS[family % len(TOPICS)]}, family {family}. Answer in one line."
        line = {"custom_id": f"{tag}-{index}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "tiny-llama", "max_tokens": rng.choice((2, 4, 8)), "temperature": 0,
                         "ignore_eos": True, "messages": [{"role": "system", "content": system},
                                                          {"role": "user", "content": f"Question {index}?"}]}}
        out += json.dumps(line).encode() + b"\n"
    return bytes(out)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summary(values: list[float]) -> dict[str, Any]:
    return {"count": len(values), "p50_ms": _ms(percentile(values, 50)), "p99_ms": _ms(percentile(values, 99)),
            "mean_ms": _ms(sum(values) / len(values) if values else None)}


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 2) if seconds is not None else None


def plot_cdf(axis: Any, seconds: list[float], label: str) -> None:
    """The empirical CDF of latencies, in milliseconds, on ``axis``: tails show where P99s do not."""
    ordered = sorted(seconds)
    axis.plot([value * 1000 for value in ordered], [(index + 1) / len(ordered) for index in range(len(ordered))],
              label=label)


async def poisson(rate: float, seconds: float, seed: int, one: Callable[[int], Awaitable[None]]) -> None:
    """``one(index)`` started at Poisson arrivals of ``rate`` per second for ``seconds``; returns
    once every one has ended."""
    rng = random.Random(seed)
    tasks, deadline, index = [], time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        tasks.append(asyncio.create_task(one(index)))
        index += 1
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)


async def poisson_online(client: openai.AsyncOpenAI, rate: float, seconds: float, seed: int) -> list[float]:
    """Streamed online chats arriving as a Poisson process; each one's time to first token."""
    ttfts: list[float] = []

    async def one(index: int) -> None:
        start = time.monotonic()
        stream = await client.chat.completions.create(
            model="tiny-llama", max_tokens=16, stream=True, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": f"Online question {index}: what is a {TOPICS[index % 8]}?"}])
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttfts.append(time.monotonic() - start)
                break
        await stream.close()

    await poisson(rate, seconds, seed, one)
    return ttfts


async def api_prober(client: openai.AsyncOpenAI, batch_ids: list[str], rate: float, stop: asyncio.Event) -> list[float]:
    """Batch API calls a dashboard makes, at ``rate`` per second until ``stop``; each one's latency."""
    calls: list[Callable[[], Awaitable[Any]]] = [lambda: client.batches.list(limit=20),
                                                 lambda: client.files.list(limit=20)]
    calls += [lambda batch_id=batch_id: client.batches.retrieve(batch_id) for batch_id in batch_ids]
    latencies: list[float] = []
    index = 0
    while not stop.is_set():
        start = time.monotonic()
        await calls[index % len(calls)]()
        latencies.append(time.monotonic() - start)
        index += 1
        await asyncio.sleep(max(0.0, 1 / rate - (time.monotonic() - start)))
    return latencies


@dataclass
class MemoryTrace:
    """The resident memory of the process holding the Batch API, sampled each second."""

    pid: int
    samples: list[tuple[float, int]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        process, began = psutil.Process(self.pid), time.monotonic()
        while not stop.is_set():
            self.samples.append((round(time.monotonic() - began, 1), process.memory_info().rss))
            await asyncio.sleep(1.0)

    def peak(self) -> int:
        """The kernel's peak resident size of the process over its whole life."""
        return _peak_rss(self.pid)

    def peaks(self) -> dict[str, int]:
        """The peak resident size of the server's every process: its HTTP process (which holds the
        Batch API and its runner), scheduler and detokenizer."""
        process = psutil.Process(self.pid)
        return {"http": _peak_rss(self.pid),
                **{child.name(): _peak_rss(child.pid) for child in process.children(recursive=True)}}


def _peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024


def fresh_server(work: Path, port: int, max_lines: int) -> ServerProcess:
    work.mkdir(parents=True, exist_ok=True)
    config = BatchApiConfig(data_dir=work / "data", max_file_lines=max_lines, max_file_bytes=1 << 30)
    return start_server("tiny-llama", ["--port", str(port), "--api-key", API_KEY, "--enable-cache-report"],
                        log_path=work / "server.log", batch_api=config)


async def submit(client: openai.AsyncOpenAI, content: bytes, name: str) -> str:
    uploaded = await client.files.create(file=(name, content), purpose="batch")
    return (await client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")).id


async def loaded_phase(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=3600)
    alone = await poisson_online(client, args.online_rate, args.online_seconds, seed=1)
    began = time.monotonic()
    batch_ids = [await submit(client, batch_file(args.lines, f"load{index}"), f"load{index}.jsonl")
                 for index in range(2)]
    submitted_s = time.monotonic() - began
    stop, memory = asyncio.Event(), MemoryTrace(server.process.pid)
    prober = asyncio.create_task(api_prober(client, batch_ids, args.api_rate, stop))
    sampler = asyncio.create_task(memory.run(stop))
    while not await _any_lines_done(client, batch_ids):
        await asyncio.sleep(1.0)
    loaded = await poisson_online(client, args.online_rate, args.online_seconds, seed=1)
    while time.monotonic() - began < args.max_batch_seconds:
        if all(batch.status in FINISHED for batch in [await client.batches.retrieve(b) for b in batch_ids]):
            break
        await asyncio.sleep(2.0)
    stop.set()
    api = await prober
    await sampler
    batches = [(await client.batches.retrieve(batch_id)).model_dump() for batch_id in batch_ids]
    done = sum(batch["request_counts"]["completed"] + batch["request_counts"]["failed"] for batch in batches)
    for batch in batches:
        if batch["status"] not in FINISHED:
            await client.batches.cancel(batch["id"])
    seconds = time.monotonic() - began
    return {"online_only_ttft": summary(alone), "loaded_ttft": summary(loaded), "api_latency": summary(api),
            "upload_and_create_s": round(submitted_s, 1), "lines_answered": done,
            "batch_seconds": round(seconds, 1), "lines_per_s": round(done / seconds, 1),
            "batches": [{key: batch[key] for key in ("id", "status", "request_counts")} for batch in batches],
            "peak_rss_bytes": memory.peak(), "peak_rss_by_process": memory.peaks(), "memory_trace": memory.samples,
            "ttfts": {"online_only": alone, "loaded": loaded}}


async def _any_lines_done(client: openai.AsyncOpenAI, batch_ids: list[str]) -> bool:
    batches = [await client.batches.retrieve(batch_id) for batch_id in batch_ids]
    return any(batch.request_counts.completed for batch in batches) or all(b.status in FINISHED for b in batches)


async def memory_phase(server: ServerProcess, lines: int, done_target: int, max_seconds: float) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=3600)
    stop, memory = asyncio.Event(), MemoryTrace(server.process.pid)
    sampler = asyncio.create_task(memory.run(stop))
    began = time.monotonic()
    batch_id = await submit(client, batch_file(lines, f"mem{lines}"), f"mem{lines}.jsonl")
    batch = await client.batches.retrieve(batch_id)
    while time.monotonic() - began < max_seconds and batch.status not in FINISHED \
            and batch.request_counts.completed + batch.request_counts.failed < done_target:
        await asyncio.sleep(2.0)
        batch = await client.batches.retrieve(batch_id)
    stop.set()
    await sampler
    if batch.status not in FINISHED:
        await client.batches.cancel(batch_id)
    return {"lines": lines, "status": batch.status, "lines_answered": batch.request_counts.completed,
            "seconds": round(time.monotonic() - began, 1), "peak_rss_bytes": memory.peak(),
            "peak_rss_by_process": memory.peaks(), "memory_trace": memory.samples}


def run_on_fresh_server(work: Path, port: int, max_lines: int, phase: Callable[[ServerProcess], Awaitable[dict]]) -> dict:
    server = fresh_server(work, port, max_lines)
    try:
        return asyncio.run(phase(server))
    finally:
        server.stop()


def judge(report: dict) -> dict[str, Any]:
    loaded, small, big = report["loaded"], report["memory_small"], report["memory_big"]
    alone_p99, loaded_p99 = loaded["online_only_ttft"]["p99_ms"], loaded["loaded_ttft"]["p99_ms"]
    growth = big["peak_rss_bytes"] / small["peak_rss_bytes"]
    return {"online_p99_ttft_ratio": round(loaded_p99 / alone_p99, 3), "online_p99_ttft_within_10pct": loaded_p99 <= 1.1 * alone_p99,
            "api_p99_ms": loaded["api_latency"]["p99_ms"], "api_p99_under_200ms": loaded["api_latency"]["p99_ms"] < 200,
            "peak_rss_big_over_small": round(growth, 3), "peak_memory_flat_within_10pct": growth <= 1.1}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ttft, memory) = plt.subplots(1, 2, figsize=(11, 4))
    for name, values in report["loaded"]["ttfts"].items():
        plot_cdf(ttft, values, name.replace("_", "-"))
    ttft.set_xlabel("online TTFT (ms)")
    ttft.set_ylabel("fraction of requests")
    ttft.legend()
    for key in ("memory_small", "memory_big"):
        trace = report[key]["memory_trace"]
        memory.plot([at for at, _rss in trace], [rss / 2**20 for _at, rss in trace], label=f"{report[key]['lines']:,} lines")
    memory.set_xlabel("seconds since upload")
    memory.set_ylabel("Batch API process RSS (MiB)")
    memory.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000, help="lines in each of the two loaded batches")
    parser.add_argument("--big-lines", type=int, default=500_000, help="lines of the large batch in the memory phase")
    parser.add_argument("--online-rate", type=float, default=2.0, help="online requests per second (Poisson)")
    parser.add_argument("--online-seconds", type=float, default=90.0, help="length of each online replay")
    parser.add_argument("--api-rate", type=float, default=5.0, help="Batch API calls per second while loaded")
    parser.add_argument("--max-batch-seconds", type=float, default=1800.0,
                        help="stop following the two batches after this long (cancelled, the lines answered reported)")
    parser.add_argument("--memory-done", type=int, default=5_000,
                        help="lines answered before the memory phase's batch is cancelled")
    parser.add_argument("--memory-seconds", type=float, default=1200.0, help="longest a memory phase runs")
    parser.add_argument("--port", type=int, default=31400)
    parser.add_argument("--work", type=Path, default=Path("/tmp/sgl-blend-batch-load"))
    parser.add_argument("--out", type=Path, default=RESULTS / "batch_load.json")
    args = parser.parse_args()
    most = max(2 * args.lines, args.big_lines)
    report: dict[str, Any] = {"args": {key: str(value) for key, value in vars(args).items()}}
    report["loaded"] = run_on_fresh_server(args.work / "loaded", args.port, most,
                                           lambda server: loaded_phase(server, args))
    for key, lines in (("memory_small", args.lines), ("memory_big", args.big_lines)):
        report[key] = run_on_fresh_server(args.work / key, args.port, most,
                                          lambda server, lines=lines: memory_phase(server, lines, args.memory_done,
                                                                                   args.memory_seconds))
    report["judged"] = judge(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"))
    print(json.dumps({"judged": report["judged"], "online_only_ttft": report["loaded"]["online_only_ttft"],
                      "loaded_ttft": report["loaded"]["loaded_ttft"], "api_latency": report["loaded"]["api_latency"],
                      "lines_answered": report["loaded"]["lines_answered"],
                      "lines_per_s": report["loaded"]["lines_per_s"],
                      "peak_rss_mib": {key: round(report[key]["peak_rss_bytes"] / 2**20, 1)
                                       for key in ("loaded", "memory_small", "memory_big")}}, indent=1))


if __name__ == "__main__":
    main()
