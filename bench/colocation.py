"""Co-location on the real CPU engine, as a functional check: every mode makes offline progress,
and its online P99 TTFT and TBT stay within the noise band of online-only replays.

Judged figures come from the emulated H100 (`bench.colocation_emulated`): on this 2-core host the
run-to-run noise of online latency is as large as any tolerance a judge could use, so this bench
claims no throughput ratio. It checks that each mode, on a real SGLang server running a real model,
does what it says: HyGen (its latency budget), Echo (its deadlines) and BROS (its RT SLOs) run
offline work beside ShareGPT online requests without pushing online latency out of the band.

- **Load**: one online-only probe at ``--probe-rate`` gives the engine's forward seconds per
  request (read from the scheduler's per-iteration records, `sglang_plugin.iteration_log`); the
  online rate is the one that keeps the engine ``--target`` busy (40%).
- **Band**: online-only replayed on ``--replays`` seeds; the targets are the median P99 TTFT and
  TBT, the tolerance their seed-to-seed spread (`bench.seed_judge`).
- **Modes**, each on the first seed's trace with a closed offline loop (few-shot batch lines with
  shared prefixes, 1-4 and 48-128 token answers): hygen with its budget at the band's P99 TBT,
  echo and bros with their SLOs at the band's targets (``k`` = 1). Every server has the same KV
  pool (``--kv-tokens``) and prefill chunk (``--chunk``).

    sgl-blend profile --latency --model tiny-llama --out bench/results/latency-model.json
    python -m bench.colocation --latency-model bench/results/latency-model.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import seed_judge
from sgl_blend.batch_lines.lines import BatchLine, parse_line
from sgl_blend.client import http
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.latency_model import load_model
from sgl_blend.launch.colocation import colocation_launch, with_free_port
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.measure.online_replay import OfflineLoad, OnlineRequest, RequestTiming, replay_with_offline, summarize
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings
from sgl_blend.workloads.arrivals import arrival_times
from sgl_blend.workloads.batch_files import fewshot_lines
from sgl_blend.workloads.sharegpt import first_exchange, iter_conversations

RESULTS = Path(__file__).parent / "results"
MODES = ("hygen", "echo", "bros")
# Before each replay: no batch for 1 s (the scheduler sleeps when idle, so the record stops), at
# most 180 s (64 leftover offline requests of <= 128 tokens drain well within it on this CPU).
IDLE_QUIET_S, IDLE_TIMEOUT_S = 1.0, 180.0
PATTERN = "poisson"


def sharegpt_prompts(n: int, seed: int, max_chars: int, max_tokens_cap: int) -> list[tuple[str, int]]:
    """First human turns and their reply lengths (about four characters a token), capped."""
    prompts = []
    for conversation in iter_conversations(limit=4 * n):
        exchange = first_exchange(conversation)
        if exchange is not None:
            prompts.append((exchange[0][:max_chars], max(4, min(max_tokens_cap, len(exchange[1]) // 4))))
    random.Random(seed).shuffle(prompts)
    return prompts[:n]


def online_trace(
    pattern: str, rate: float, duration_s: float, period_s: float, prompts: Sequence[tuple[str, int]], seed: int
) -> list[OnlineRequest]:
    """ShareGPT prompts at `arrival_times` of ``pattern`` (Poisson, or bursty with 3x swings), in an
    order of ``seed``'s own. With one order for every seed, each trace began with the same prompts,
    and a server answered every replay after the first from its prefix cache: in the emulated
    judge, online-only's later replays found 99-100% of their prompt tokens cached."""
    times = arrival_times(pattern, rate, duration_s, period_s, seed)
    order = random.Random(seed).sample(range(len(prompts)), len(prompts))
    return [OnlineRequest(t, *prompts[order[index % len(prompts)]]) for index, t in enumerate(times)]


def offline_lines(n: int, seed: int) -> list[BatchLine]:
    lines = [
        parse_line(json.dumps(line), number, ("/v1/completions",))
        for number, line in enumerate(fewshot_lines(n=n, groups=8, seed=seed), start=1)
    ]
    return [line for line in lines if isinstance(line, BatchLine)]


@dataclass
class Engine:
    """A running server and the JSONL file its scheduler appends one record per batch to."""

    server: ServerProcess
    records: Path

    def last_batch_at(self) -> float | None:
        """Wall time the last recorded batch ended (None: none yet)."""
        if not self.records.exists() or not self.records.stat().st_size:
            return None
        with self.records.open("rb") as handle:
            handle.seek(max(self.records.stat().st_size - 4096, 0))
            tail = handle.read().decode(errors="replace").strip().splitlines()
        for line in reversed(tail):
            try:
                return float(json.loads(line)["wall"])
            except (ValueError, KeyError):
                continue
        return None

    def wait_idle(self, quiet_s: float, timeout_s: float) -> float:
        """Wait until no batch has run for ``quiet_s``: the previous trial's offline requests (a
        client that stops does not stop the ones the server already runs) must not load the next
        one. Returns the seconds waited (``timeout_s`` at most)."""
        started = time.time()
        while time.time() - started < timeout_s:
            last = self.last_batch_at()
            if last is None or time.time() - last >= quiet_s:
                break
            time.sleep(quiet_s / 4)
        return time.time() - started

    def flush_cache(self) -> None:
        """Empty the prefix cache (SGLang's ``/flush_cache``, which only an idle engine takes), so a
        replay's prompts are new to the server, as a user's are, whatever ran before."""
        with http.client(self.server.base_url) as client:
            response = client.post("/flush_cache")
        if response.is_error:
            raise RuntimeError(f"the prefix cache was not flushed: {response.text.strip()}")

    def size(self) -> int:
        return self.records.stat().st_size if self.records.exists() else 0

    def busy_s(self, start: float, end: float, offset: int = 0) -> float:
        """Forward time of the batches that ended in ``[start, end]`` (wall clock), reading the
        records from byte ``offset`` on (where they stood before the replay)."""
        if not self.records.exists():
            return 0.0
        busy = 0.0
        with self.records.open() as handle:
            handle.seek(offset)
            for line in handle:
                record = json.loads(line)
                if start <= record.get("wall", 0.0) <= end:
                    busy += record.get("forward_s", 0.0)
        return busy


@contextmanager
def serving(
    name: str, args: argparse.Namespace, sglang_args: Sequence[str], settings: PluginSettings, work: Path
) -> Iterator[Engine]:
    records = work / f"{name}.records.jsonl"
    records.unlink(missing_ok=True)
    settings = settings.updated(iteration_log=str(records))
    server = start_server(args.model, with_free_port(sglang_args), log_path=work / f"{name}.log", settings=settings)
    try:
        yield Engine(server, records)
    finally:
        server.stop()


def run_trial(
    engine: Engine, trace: Sequence[OnlineRequest], lines: Sequence[BatchLine] | None, *, concurrency: int
) -> dict[str, Any]:
    """One replay: online metrics, offline output tokens/s and engine utilisation. A replay that
    raises (a server gone) counts as missing every SLO, and so does one after which the server
    says the plugin switched a part off."""

    async def go() -> tuple[list[RequestTiming], dict[str, float]]:
        offline = OfflineLoad(engine.server.base_url, lines, concurrency=concurrency) if lines else None
        return await replay_with_offline(engine.server.base_url, trace, offline)

    engine.wait_idle(IDLE_QUIET_S, IDLE_TIMEOUT_S)
    offset = engine.size()
    try:
        timings, throughput = asyncio.run(go())
    except Exception as error:  # noqa: BLE001 -- any failure of a replay is a failed run, reported
        return {
            **{metric: math.inf for metric in seed_judge.SLO_METRICS},
            "offline_tokens_per_s": 0.0,
            "utilisation": 0.0,
            "failed": f"{type(error).__name__}: {error}",
        }
    start = throughput.pop("start")
    wall_start = time.time() - (time.perf_counter() - start)
    busy = engine.busy_s(wall_start, wall_start + throughput["window_s"], offset)
    run = {**summarize(timings), **throughput, "utilisation": busy / throughput["window_s"]}
    return judged_as_failed_if_switched_off(run, http.server_info(engine.server.base_url))


def judged_as_failed_if_switched_off(run: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """``run``, marked failed (every SLO missed, its figures kept) when the server ``info`` says a
    part of the plugin switched off: from then on its figures are SGLang's own scheduling."""
    off = http.switched_off(info)
    if off:
        run["failed"] = f"sgl-blend switched off {', '.join(off)} (see the server log)"
    return run


def engine_args(args: argparse.Namespace) -> list[str]:
    """The engine every mode shares: KV pool and prefill chunk size."""
    return ["--max-total-tokens", str(args.kv_tokens), "--chunked-prefill-size", str(args.chunk)]


def online_rate(engine: Engine, args: argparse.Namespace, prompts: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """The probe: online-only at ``--probe-rate``; engine seconds per request; the rate for ``--target``."""
    trace = online_trace(PATTERN, args.probe_rate, args.duration, args.duration, prompts, 0)
    probe = run_trial(engine, trace, None, concurrency=args.concurrency)
    per_request = probe["utilisation"] * probe["window_s"] / max(probe["requests"], 1)
    rate = args.target / per_request if per_request > 0 else args.probe_rate
    return {
        "probe_rate_per_s": args.probe_rate,
        "probe_utilisation": probe["utilisation"],
        "engine_s_per_request": per_request,
        "rate_per_s": rate,
    }


def check(run: dict[str, Any], targets: dict[str, float], tolerance: float) -> dict[str, Any]:
    """A mode's run against the band: offline progress, and which SLO metrics left the band."""
    outside = seed_judge.violated(run, targets, tolerance)
    return {
        "offline_progress": run["offline_tokens_per_s"] > 0,
        "outside_band": outside,
        "passed": run["offline_tokens_per_s"] > 0 and not outside,
    }


def mode_settings(mode: str, args: argparse.Namespace, targets: dict[str, float]) -> PluginSettings:
    model = load_model(args.latency_model, "bros" if mode == "bros" else None).to_dict()
    if mode == "hygen":
        colocation = ColocationConfig(mode="hygen", latency_model=model, latency_budget_s=targets["tbt_p99"])
    else:
        # Echo's and BROS's SLOs at the band's targets; an iteration no online deadline bounds is
        # capped at the TPOT deadline.
        ttft, tpot = targets["ttft_p99"], targets["tbt_p99"]
        colocation = ColocationConfig(
            mode=mode, latency_model=model, ttft_slo_s=ttft, tpot_slo_s=tpot, idle_budget_s=tpot
        )
    return PluginSettings(
        offline_policy=OFF if mode == "bros" else "psm", psm_utility=args.utility, colocation=colocation
    )


def run_check(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    prompts = sharegpt_prompts(400, args.seed, max_chars=600, max_tokens_cap=48)
    lines = offline_lines(args.offline_n, args.seed)
    plain = PluginSettings(
        offline_policy="psm",
        psm_utility=args.utility,
        colocation=ColocationConfig(mode="hygen", latency_model=load_model(args.latency_model).to_dict()),
    )
    with serving("online-only", args, colocation_launch(plain, engine_args(args)), plain, work) as engine:
        load = online_rate(engine, args, prompts)
        traces = [
            online_trace(PATTERN, load["rate_per_s"], args.duration, args.duration, prompts, seed)
            for seed in range(1, args.replays + 1)
        ]
        references = [run_trial(engine, trace, None, concurrency=args.concurrency) for trace in traces]
    targets, tolerance = seed_judge.slo_targets(references), seed_judge.tolerance(references)
    modes = {}
    for mode in MODES:
        settings = mode_settings(mode, args, targets)
        try:
            with serving(mode, args, colocation_launch(settings, engine_args(args)), settings, work) as engine:
                run = run_trial(engine, traces[0], lines, concurrency=args.concurrency)
        except RuntimeError as error:  # the server did not start: a failed check, reported
            run = {
                **{metric: math.inf for metric in seed_judge.SLO_METRICS},
                "offline_tokens_per_s": 0.0,
                "failed": f"server start: {error}",
            }
        modes[mode] = {**run, **check(run, targets, tolerance)}
    return {
        "model": args.model,
        "duration_s": args.duration,
        "kv_tokens": args.kv_tokens,
        "chunk": args.chunk,
        "concurrency": args.concurrency,
        "offline_lines": len(lines),
        "load": load,
        "online_only": references,
        "targets_s": targets,
        "tolerance": tolerance,
        "seed_spread": seed_judge.seed_spread(references),
        "modes": modes,
        "all_passed": all(result["passed"] for result in modes.values()),
    }


def markdown(report: dict[str, Any]) -> str:
    targets = report["targets_s"]
    lines = [
        f"Online {report['load']['rate_per_s']:.3g} req/s; band: P99 TTFT {targets['ttft_p99'] * 1000:.1f} ms and "
        f"P99 TBT {targets['tbt_p99'] * 1000:.2f} ms (median of {len(report['online_only'])} online-only "
        f"replays), tolerance {report['tolerance']:.1%} (their seed spread).",
        "",
        "| mode | P99 TTFT (ms) | P99 TBT (ms) | offline tok/s | offline progress | within the band | passed |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, result in report["modes"].items():
        band = "yes" if not result["outside_band"] else "no: " + ", ".join(result["outside_band"])
        lines.append(
            f"| {mode} | {result['ttft_p99'] * 1000:.1f} | {result['tbt_p99'] * 1000:.2f} | "
            f"{result['offline_tokens_per_s']:.1f} | {'yes' if result['offline_progress'] else 'no'} | "
            f"{band} | {'yes' if result['passed'] else 'no'} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--latency-model", type=Path, default=RESULTS / "latency-model.json")
    parser.add_argument("--target", type=float, default=0.4, help="online-only engine utilisation of the load")
    parser.add_argument("--probe-rate", type=float, default=0.5, help="online req/s of the load probe")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of online trace per replay")
    parser.add_argument("--replays", type=int, default=3, help="online-only replays (seeds) the band is measured on")
    parser.add_argument("--concurrency", type=int, default=64, help="offline requests in flight at most")
    parser.add_argument("--utility", type=float, default=0.9, help="PSM utility u for the offline order")
    parser.add_argument("--kv-tokens", type=int, default=16384)
    parser.add_argument("--chunk", type=int, default=512, help="SGLang --chunked-prefill-size for every server")
    parser.add_argument("--offline-n", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "colocation.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    work = args.out.parent / f"{args.out.stem}-work"
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    report = run_check(args, work)
    report["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report) + "\n")
    print(markdown(report))
    print(f"wall time {report['wall_s']} s -> {args.out}")


if __name__ == "__main__":
    main()
