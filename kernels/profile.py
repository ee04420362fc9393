"""Measure this device and write a `HardwareSpec` profile for the cost model.

The peak achievable GEMM rate becomes ``flops`` and the peak decode-attention streaming rate
becomes ``bandwidth``; KV memory is what the device can spare for the cache (on a CPU, a fixed
share of RAM). The Table-1-style report then predicts each measured shape from that profile,
which shows how far one pair of numbers carries across shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sgl_blend.core.cost_model import HardwareSpec
from sgl_blend.kernels.decode_attention import measure_decode_attention
from sgl_blend.kernels.gemm import measure_gemm

CPU_KV_FRACTION = 0.25
GPU_KV_FRACTION = 0.7


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).lower().replace(" ", "-")
    return "cpu"


def _kv_memory_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free * GPU_KV_FRACTION
    import psutil

    return psutil.virtual_memory().total * CPU_KV_FRACTION


def _shapes(device: torch.device, quick: bool) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    if device.type == "cuda":
        gemms = [(tokens, 4096, 14336) for tokens in (128, 512, 2048, 8192)]
        attentions = [(batch, kv_len) for batch, kv_len in ((32, 1024), (64, 4096), (128, 8192))]
    else:
        gemms = [(tokens, 1024, 2816) for tokens in ((16, 128, 512) if quick else (16, 128, 512, 2048))]
        shapes = ((4, 512), (8, 2048)) if quick else ((4, 512), (8, 2048), (16, 4096))
        attentions = [(batch, kv_len) for batch, kv_len in shapes]
    return gemms, attentions


def run_profile(out: Path, device: str | None = None, quick: bool = False) -> dict[str, Any]:
    """Measure, write the profile JSON to ``out``, and return the report."""
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if target.type == "cuda" else torch.float32
    gemm_shapes, attention_shapes = _shapes(target, quick)
    gemms = [measure_gemm(tokens, hidden, ffn, target, dtype) for tokens, hidden, ffn in gemm_shapes]
    attentions = [
        measure_decode_attention(batch, kv_len, 32, 8, 128, target, dtype) for batch, kv_len in attention_shapes
    ]
    spec = HardwareSpec(
        name=_device_name(target),
        flops=max(result.flops_per_s for result in gemms),
        bandwidth=max(result.bytes_per_s for result in attentions),
        kv_memory_bytes=_kv_memory_bytes(target),
    )
    rows: list[dict[str, Any]] = [
        {
            "op": "gemm",
            "shape": f"{r.tokens}x{r.hidden}x{r.ffn}",
            "measured_ms": r.seconds * 1e3,
            "estimated_ms": r.flops / spec.flops * 1e3,
        }
        for r in gemms
    ] + [
        {
            "op": "decode_attention",
            "shape": f"b{r.batch} kv{r.kv_len}",
            "measured_ms": r.seconds * 1e3,
            "estimated_ms": r.bytes / spec.bandwidth * 1e3,
        }
        for r in attentions
    ]
    for row in rows:
        row["error_pct"] = 100.0 * (row["estimated_ms"] - row["measured_ms"]) / row["measured_ms"]
    out.parent.mkdir(parents=True, exist_ok=True)
    spec.to_json(out, {"dtype": str(dtype).removeprefix("torch."), "table": rows})
    return {"hardware": spec, "table": rows}


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'op':<17} {'shape':<20} {'estimated ms':>13} {'measured ms':>12} {'error':>8}"]
    for row in rows:
        lines.append(
            f"{row['op']:<17} {row['shape']:<20} {row['estimated_ms']:>13.3f} "
            f"{row['measured_ms']:>12.3f} {row['error_pct']:>7.1f}%"
        )
    return "\n".join(lines)
