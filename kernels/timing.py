"""Timing a device op: warm up, synchronise, take the median of several runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(op: Callable[[], object], device: torch.device, repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        op()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        op()
        synchronize(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
