"""`sgl-blend profile --latency`: time a grid of batch compositions on the live engine and fit
the latency models on what the scheduler recorded.

Each grid point runs ``decoders`` requests with a ``decode_context``-token prompt (or prompts
spread evenly over ``context_spread`` more tokens) that decode for a while, and ``prefills``
requests of ``prefill_len`` new tokens (after a ``prefix``-token cached prefix) sent once the
decoders are decoding. Prompts are random token ids, so nothing is shared by accident. Points
with no decoders give prefill-only batches, points with no prefills decode-only batches, the rest
mixed ones -- what each model form needs; the spread points are the only batches whose longest
context is far from their mean, which is what tells Echo's ``γ max(L)`` from ``δ mean(L)``. The
fit uses the scheduler's own per-iteration record (`sglang_plugin.iteration_log`), so the model
predicts exactly what the co-location scheduler later asks about: a batch's forward time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from sgl_blend.core.latency_model import BATCH_KINDS, BatchShape, FitReport, fit_forms
from sgl_blend.measure.online_replay import fresh_connections

DECODE_STEPS = 48
DECODER_HEAD_START_S = 0.15
WARMUP_POINTS = 2
FIT_TARGET = "forward_s"


@dataclass(frozen=True)
class GridPoint:
    decoders: int
    decode_context: int
    prefills: int
    prefill_len: int
    prefix: int = 0
    context_spread: int = 0

    def decoder_contexts(self) -> list[int]:
        steps = max(self.decoders - 1, 1)
        return [self.decode_context + self.context_spread * index // steps for index in range(self.decoders)]


def latency_grid(quick: bool = False) -> list[GridPoint]:
    """Prefill-only, decode-only and mixed compositions, sized for the batches a co-located CPU
    server runs (a GPU profile wants larger ones: pass a longer grid through the library);
    ``quick`` is a coarse subset."""
    prefill_lens = (32, 256, 1024) if quick else (16, 64, 256, 512, 1024, 2048)
    prefill_counts = (1, 4) if quick else (1, 2, 4)
    decoder_counts = (1, 8, 32) if quick else (1, 4, 16, 32)
    contexts = (64, 1024) if quick else (64, 256, 1024)
    points = [
        GridPoint(0, 0, count, length)
        for count, length in itertools.product(prefill_counts, prefill_lens)
        if count * length <= 4096
    ]
    points += [
        GridPoint(0, 0, count, length, prefix)
        for count, length, prefix in itertools.product((1, 4), (32, 256), (512,) if quick else (256, 1024))
    ]
    points += [GridPoint(count, context, 0, 0) for count, context in itertools.product(decoder_counts, contexts)]
    spread_decoders = ((8, 64, 960),) if quick else ((4, 64, 1984), (16, 64, 960), (32, 64, 448))
    points += [GridPoint(count, context, 0, 0, context_spread=spread) for count, context, spread in spread_decoders]
    mixed_decoders = ((4, 256), (16, 512), (32, 64)) if quick else ((4, 256), (8, 1024), (16, 512), (32, 64))
    mixed_prefills = ((1, 64), (1, 512), (4, 256)) if quick else ((1, 32), (1, 256), (1, 1024), (4, 256))
    points += [
        GridPoint(count, context, prefills, length)
        for (count, context), (prefills, length) in itertools.product(mixed_decoders, mixed_prefills)
    ]
    return points


class _Prompts:
    """Random token-id prompts, seeded; a prefix is kept so later prompts can share it."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.vocab = vocab_size

    def tokens(self, length: int) -> list[int]:
        return [self.rng.randrange(16, self.vocab - 16) for _ in range(length)]


async def _generate(client: httpx.AsyncClient, input_ids: list[int], max_new_tokens: int) -> None:
    body = {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
    }
    response = await client.post("/generate", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"/generate answered {response.status_code}: {response.text[:300]}")


async def _run_point(client: httpx.AsyncClient, point: GridPoint, prompts: _Prompts) -> None:
    prefix = prompts.tokens(point.prefix) if point.prefix else []
    if prefix:
        await _generate(client, prefix, 1)
    decoders = [
        asyncio.create_task(_generate(client, prompts.tokens(context), DECODE_STEPS))
        for context in point.decoder_contexts()
    ]
    if decoders:
        await asyncio.sleep(DECODER_HEAD_START_S)
    prefills = [_generate(client, prefix + prompts.tokens(point.prefill_len), 1) for _ in range(point.prefills)]
    await asyncio.gather(*prefills, *decoders)


async def drive_grid(
    base_url: str, points: Sequence[GridPoint], vocab_size: int, seed: int = 0, repeats: int = 1
) -> None:
    prompts = _Prompts(vocab_size, seed)
    async with fresh_connections(base_url) as client:
        for _ in range(repeats):
            for point in points:
                await _run_point(client, point, prompts)


def read_records(log_path: Path) -> Iterator[dict[str, Any]]:
    with log_path.open() as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def noise_floor(records: Sequence[dict[str, Any]], target: str = FIT_TARGET) -> float | None:
    """The MAPE of predicting each decode-only batch by the one just before it with the same
    number of requests (one token more context each): no model of the batch's composition can
    do better, so it is the run-to-run noise of this machine. None without such pairs."""
    errors = [
        abs(after[target] - before[target]) / after[target]
        for before, after in zip(records, records[1:])
        if before["mode"] == after["mode"] == "decode"
        and before["decode_reqs"] == after["decode_reqs"]
        and after["iteration"] == before["iteration"] + 1
        and after.get(target, 0) > 0
    ]
    return float(sum(errors) / len(errors)) if errors else None


def fit_records(records: Sequence[dict[str, Any]], target: str = FIT_TARGET, seed: int = 0) -> FitReport:
    usable = [record for record in records if record.get(target, 0) > 0]
    shapes = [BatchShape.from_dict(record) for record in usable]
    return fit_forms(shapes, [record[target] for record in usable], seed=seed)


def profile_latency(
    model: str,
    out: Path,
    *,
    quick: bool = False,
    repeats: int = 1,
    seed: int = 0,
    sglang_args: Sequence[str] = (),
    cache_dir: Path | None = None,
) -> dict[str, Any]:
    """Start a server, run the grid ``repeats`` times, fit, and write the report to ``out``
    (and the raw per-iteration records beside it, ``<out>.records.jsonl``)."""
    from sgl_blend.launch.colocation import with_free_port
    from sgl_blend.launch.flags import with_defaults
    from sgl_blend.launch.supervisor import start_server
    from sgl_blend.models.registry import resolve_model_path
    from sgl_blend.sglang_plugin.settings import ANNOTATED_CACHE, MIXED_CHUNK, OFF, PluginSettings

    out.parent.mkdir(parents=True, exist_ok=True)
    records_path = out.with_suffix(".records.jsonl")
    records_path.unlink(missing_ok=True)
    vocab_size = int(json.loads((resolve_model_path(model, cache_dir) / "config.json").read_text())["vocab_size"])
    points = latency_grid(quick)
    # Profiled on the engine co-location runs (mixed batches, the plugin's radix cache), without a pool.
    settings = PluginSettings(offline_policy=OFF, iteration_log=str(records_path))
    args = with_defaults(with_free_port(sglang_args), MIXED_CHUNK + ANNOTATED_CACHE)
    server = start_server(model, args, cache_dir=cache_dir, log_path=out.with_suffix(".server.log"), settings=settings)
    try:
        asyncio.run(drive_grid(server.base_url, points[:WARMUP_POINTS], vocab_size, seed))
        warmup = sum(1 for _ in read_records(records_path))
        asyncio.run(drive_grid(server.base_url, points, vocab_size, seed + 1, repeats))
    finally:
        server.stop()
    records = list(read_records(records_path))[warmup:]
    report = fit_records(records, seed=seed)
    result = {
        "model": model,
        "target": FIT_TARGET,
        "grid_points": len(points),
        "repeats": repeats,
        "records": str(records_path),
        "noise_floor_mape": noise_floor(records),
        **report.to_dict(),
        "grid": [asdict(point) for point in points],
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_report(result: dict[str, Any]) -> str:
    """The table `sgl-blend profile --latency` prints: each form's MAPE overall and, held out,
    per batch kind (a report written before those were kept shows dashes)."""
    lines = [
        f"{'form':<6} {'train MAPE':>11} {'held-out MAPE':>14}   held out: "
        + " ".join(f"{kind:>8}" for kind in BATCH_KINDS)
    ]
    for form, fitted in result["forms"].items():
        by_kind = fitted.get("holdout_mape_by_kind", {})
        kinds = " ".join(f"{by_kind[kind] * 100:>7.2f}%" if kind in by_kind else f"{'-':>8}" for kind in BATCH_KINDS)
        lines.append(
            f"{form:<6} {fitted['train_mape'] * 100:>10.2f}% {fitted['holdout_mape'] * 100:>13.2f}%             {kinds}"
        )
    for form, error in result.get("errors", {}).items():
        lines.append(f"{form:<6} not fitted: {error}")
    lines.append(
        f"{result['train_batches']} training and {result['holdout_batches']} held-out batches; best: {result['best']}"
    )
    if result.get("noise_floor_mape") is not None:
        lines.append(
            f"noise floor (consecutive decode batches of the same size): {result['noise_floor_mape'] * 100:.2f}% MAPE"
        )
    return "\n".join(lines)
