"""GEMM and decode attention run together: how much of the smaller one overlap really hides.

BlendServe's gain rests on running a compute-bound GEMM and a memory-bound attention at the same
time, so that a step costs ``max(T_comp, T_mem)`` instead of their sum. Real kernels contend for
SMs, L2 and issue slots, so the measured co-run time sits between the two. Timing each op alone
and both together over a grid of sizes, then fitting ``a max + b min + k``, gives the overlap
function the simulator should use; ``b`` is the interference constant.

Two ways to co-run are measured. ``naive``: two ordinary streams with interleaved launches; a
large cuBLAS GEMM fills every SM, so the attention mostly waits. ``partitioned`` (CUDA only): each
op on its own CUDA green context, a fixed share of the SMs each, as NanoFlow partitions them; the
best of a few splits is kept, as such an engine tunes its split. ``partition_bound``: the longer of
the two ops each run alone on its partition of that split -- what the split would give if the
partitions did not contend for memory and L2, the most an SM-partitioned engine can reach. On a
CPU the two ops run in two threads, where torch releases the GIL inside each op.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from sgl_blend.forward_time.overlap import fit_overlap
from sgl_blend.kernels.timing import median_seconds

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


@dataclass
class CorunSample:
    gemm_tokens: int
    attention_batch: int
    kv_len: int
    gemm_s: float
    attention_s: float
    together_s: float
    partitioned_s: float | None = None
    gemm_sms: int | None = None
    gemm_on_partition_s: float | None = None
    attention_on_partition_s: float | None = None


def _ops(
    tokens: int, batch: int, kv_len: int, hidden: int, ffn: int, device: torch.device, dtype: torch.dtype
) -> tuple[Callable[[], object], Callable[[], object]]:
    activations = torch.randn(tokens, hidden, device=device, dtype=dtype)
    weight = torch.randn(hidden, ffn, device=device, dtype=dtype)
    query = torch.randn(batch, HEADS, 1, HEAD_DIM, device=device, dtype=dtype)
    keys = torch.randn(batch, KV_HEADS, kv_len, HEAD_DIM, device=device, dtype=dtype)
    values = torch.randn(batch, KV_HEADS, kv_len, HEAD_DIM, device=device, dtype=dtype)
    return (
        lambda: torch.matmul(activations, weight),
        lambda: F.scaled_dot_product_attention(query, keys, values, enable_gqa=True),
    )


@dataclass
class GreenPartition:
    """Two streams on disjoint SM sets. The green contexts are kept here because a stream of a
    context that was garbage-collected fails with "context is destroyed"."""

    gemm_sms: int
    contexts: tuple[object, object]
    streams: tuple[torch.cuda.Stream, torch.cuda.Stream]


def _green_context(num_sms: int, device: torch.device) -> tuple[object, torch.cuda.Stream]:
    """A context on ``num_sms`` SMs and a stream in it (torch's green-context API changed between
    releases: newer ones hand out the stream, older ones make the context current)."""
    from torch.cuda.green_contexts import GreenContext

    # torch annotates the context as `object`; its methods differ between releases (above)
    context: Any = GreenContext.create(num_sms=num_sms, device_id=device.index or 0)
    if hasattr(context, "Stream"):
        return context, context.Stream()
    context.set_context()
    try:
        return context, torch.cuda.Stream(device)
    finally:
        context.pop_context()


def _together(
    gemm: Callable[[], object],
    attention: Callable[[], object],
    device: torch.device,
    loops: int,
    streams: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = None,
) -> Callable[[], None]:
    if device.type == "cuda":
        streams = streams or (torch.cuda.Stream(device), torch.cuda.Stream(device))

        def run() -> None:
            current = torch.cuda.current_stream(device)
            for stream in streams:
                stream.wait_stream(current)
            for _ in range(loops):
                with torch.cuda.stream(streams[0]):
                    gemm()
                with torch.cuda.stream(streams[1]):
                    attention()
            for stream in streams:
                current.wait_stream(stream)

        return run

    def run_threads() -> None:
        threads = [threading.Thread(target=lambda op=op: [op() for _ in range(loops)]) for op in (gemm, attention)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    return run_threads


def measure_corun(
    tokens: int,
    batch: int,
    kv_len: int,
    device: torch.device,
    dtype: torch.dtype,
    hidden: int = 4096,
    ffn: int = 14336,
    loops: int = 20,
    repeats: int = 5,
    partitions: Sequence[GreenPartition] = (),
) -> CorunSample:
    """Each op alone and both together, ``loops`` launches each, so launch cost is amortised;
    with ``partitions``, also the best of the partitioned co-runs."""
    gemm, attention = _ops(tokens, batch, kv_len, hidden, ffn, device, dtype)

    def timed(run: Callable[[], object]) -> float:
        return median_seconds(run, device, repeats, warmup=1)

    alone = [timed(_repeated(op, loops)) for op in (gemm, attention)]
    together = timed(_together(gemm, attention, device, loops))
    sample = CorunSample(tokens, batch, kv_len, alone[0] / loops, alone[1] / loops, together / loops)
    best: GreenPartition | None = None
    for partition in partitions:
        seconds = timed(_together(gemm, attention, device, loops, partition.streams)) / loops
        if sample.partitioned_s is None or seconds < sample.partitioned_s:
            sample.partitioned_s, sample.gemm_sms, best = seconds, partition.gemm_sms, partition
    if best is not None:
        sample.gemm_on_partition_s, sample.attention_on_partition_s = (
            timed(_on_stream(op, stream, device, loops)) / loops for op, stream in zip((gemm, attention), best.streams)
        )
    return sample


def _repeated(op: Callable[[], object], loops: int) -> Callable[[], list[object]]:
    """``op`` ``loops`` times, one launch after another."""
    return lambda: [op() for _ in range(loops)]


def _on_stream(
    op: Callable[[], object], stream: torch.cuda.Stream, device: torch.device, loops: int
) -> Callable[[], None]:
    """One op alone on a partition's stream: how fast it runs on that share of the SMs."""

    def run() -> None:
        current = torch.cuda.current_stream(device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            for _ in range(loops):
                op()
        current.wait_stream(stream)

    return run


def green_partitions(
    device: torch.device, gemm_shares: Sequence[float] = (0.5, 0.625, 0.75, 0.875)
) -> list[GreenPartition]:
    """SM splits for the partitioned co-run, in Hopper's 8-SM granularity; empty where green
    contexts are unavailable (a CPU, an older driver or torch)."""
    if device.type != "cuda":
        return []
    total = torch.cuda.get_device_properties(device).multi_processor_count
    partitions = []
    for share in gemm_shares:
        gemm_sms = int(total * share) // 8 * 8
        try:
            (gemm_context, gemm_stream), (attention_context, attention_stream) = (
                _green_context(gemm_sms, device),
                _green_context(total - gemm_sms, device),
            )
        except (ImportError, RuntimeError, AttributeError, TypeError):
            return []
        partitions.append(GreenPartition(gemm_sms, (gemm_context, attention_context), (gemm_stream, attention_stream)))
    return partitions


def corun_grid(device: torch.device, quick: bool = False) -> list[tuple[int, int, int]]:
    """Sizes spanning compute/memory ratios from about 1:4 to 4:1 on the device at hand."""
    gemm_tokens: tuple[int, ...]
    attentions: tuple[tuple[int, int], ...]
    if device.type == "cuda":
        gemm_tokens = (256, 1024, 2048, 4096, 8192)
        attentions = ((16, 4096), (64, 4096), (64, 8192), (128, 8192), (256, 8192))
    else:
        gemm_tokens = (16, 64) if quick else (16, 64, 256)
        attentions = ((2, 256), (4, 1024)) if quick else ((2, 256), (4, 1024), (8, 2048))
    return [(tokens, batch, kv_len) for tokens in gemm_tokens for batch, kv_len in attentions]


def fit_report(samples: Sequence[CorunSample]) -> dict:
    """Per co-run mode, the free fit ``a max + b min + k`` and the one-parameter form the
    simulator's ``interference`` overlap uses (``a = 1, k = 0``), each with its mean error."""
    modes = {"naive": [(s.gemm_s, s.attention_s, s.together_s) for s in samples]}
    partitioned = [(s.gemm_s, s.attention_s, s.partitioned_s) for s in samples if s.partitioned_s is not None]
    if len(partitioned) == len(samples):
        modes["partitioned"] = partitioned
        modes["partition_bound"] = [(s.gemm_s, s.attention_s, _partition_bound(s)) for s in samples]
    report: dict[str, Any] = {mode: _fit(triples) for mode, triples in modes.items()}
    report["samples"] = [asdict(s) for s in samples]
    return report


def _partition_bound(sample: CorunSample) -> float:
    """The longer of the two ops alone on the best split's partitions, measured with that split."""
    gemm_s, attention_s = sample.gemm_on_partition_s, sample.attention_on_partition_s
    assert gemm_s is not None and attention_s is not None, "measured wherever a split was kept"
    return max(gemm_s, attention_s)


def _fit(triples: list[tuple[float, float, float]]) -> dict:
    a, b, k = fit_overlap(triples)
    shorter = [min(c, m) for c, m, _t in triples]
    excess = [t - max(c, m) for c, m, t in triples]
    interference = sum(s * e for s, e in zip(shorter, excess)) / sum(s * s for s in shorter)

    def error(predict: Callable[[float, float], float]) -> float:
        return statistics.mean(abs(predict(c, m) - t) / t for c, m, t in triples)

    return {
        "fitted": {"a": a, "b": b, "k": k, "mean_abs_error": error(lambda c, m: a * max(c, m) + b * min(c, m) + k)},
        "interference": {
            "lambda": interference,
            "mean_abs_error": error(lambda c, m: max(c, m) + interference * min(c, m)),
        },
        "sum_mean_abs_error": error(lambda c, m: c + m),
        "max_mean_abs_error": error(max),
    }
