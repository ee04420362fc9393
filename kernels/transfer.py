"""Host <-> device copy bandwidth: what a KV swap costs.

BROS checkpoints the KV slots a real-time request takes from a best-effort one to host memory
and swaps them back later; its iteration time is ``max(exec, swap)``, so the swap model needs the
copy rate this machine really reaches, per direction, from pinned host memory. On a CPU the
"device" is host memory too, and the figure is a plain memory copy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from sgl_blend.kernels.timing import median_seconds

MIB = 2**20


@dataclass
class TransferResult:
    direction: str
    bytes: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds


def measure_transfers(device: torch.device, sizes_mib: tuple[int, ...] = (1, 16, 64, 256)) -> list[TransferResult]:
    results = []
    pinned = device.type == "cuda"
    for size in sizes_mib:
        host = torch.empty(size * MIB, dtype=torch.uint8, pin_memory=pinned)
        on_device = torch.empty(size * MIB, dtype=torch.uint8, device=device)
        results.append(
            TransferResult(
                "host_to_device",
                size * MIB,
                median_seconds(functools.partial(on_device.copy_, host, non_blocking=pinned), device),
            )
        )
        results.append(
            TransferResult(
                "device_to_host",
                size * MIB,
                median_seconds(functools.partial(host.copy_, on_device, non_blocking=pinned), device),
            )
        )
    return results


def peak_bandwidth(results: list[TransferResult], direction: str) -> float:
    return max(result.bytes_per_s for result in results if result.direction == direction)
