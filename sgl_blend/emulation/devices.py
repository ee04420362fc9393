"""The devices an emulated server can stand for: how each prices a forward and how much memory it has.

Pricing is the cost model's `HardwareSpec` -- the one the simulator uses under the same name
(``h100`` is the built-in ``h100-sxm``, ``a100-80g`` the built-in ``a100-80g``), so an emulated
run and ``sgl-blend sim --hardware`` price alike; a profile JSON (`sgl-blend profile`, e.g.
``bench/results/hw_h100.json``) prices with measured figures instead. Memory is what SGLang's own
sizing reads (`memory`): the total ``nvidia-smi`` reports, which picks SGLang's defaults and its
memory fraction, and what is free when SGLang measures before loading weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sgl_blend.core.cost_model import HardwareSpec
from sgl_blend.emulation.config import CPU_DEVICE

# ``nvidia-smi --query-gpu=memory.total`` (MiB), which SGLang's `get_device_memory_capacity`
# reads: "NVIDIA H100 80GB HBM3 ... 81559MiB", "A100-SXM4-80GB ... 81920MiB".
H100_TOTAL_MIB = 81559
A100_80G_TOTAL_MIB = 81920
# The device's total as CUDA reports it to PyTorch (``torch.cuda.mem_get_info``, which SGLang's
# `get_available_gpu_memory` reads), from PyTorch's out-of-memory messages: "GPU 0 has a total
# capacity of 79.11 GiB" on an H100 (vllm-project/vllm#27508), 79.15 GiB on an A100-SXM4-80GB.
H100_USABLE_GIB = 79.11
A100_80G_USABLE_GIB = 79.15
# What is already taken when SGLang measures free memory before loading weights (CUDA context,
# torch.distributed): its own log on an 80 GB H100 serving Llama-3.1-8B at TP 1 says
# "Load weight begin. avail mem=78.43 GB" (SGLang documentation build, LoRA notebook, 2026-02).
# The same software stack is assumed to take the same on an A100.
SGLANG_FREE_AT_LOAD_H100_GIB = 78.43
STARTUP_OVERHEAD_GIB = H100_USABLE_GIB - SGLANG_FREE_AT_LOAD_H100_GIB
# Keys a profile JSON gives its memory under (the `sgl-blend profile` output has neither: add them
# from nvidia-smi and torch.cuda.mem_get_info).
PROFILE_TOTAL_MIB = "memory_total_mib"
PROFILE_USABLE_GIB = "memory_usable_gib"


@dataclass(frozen=True)
class DeviceMemory:
    """``total_mib`` as nvidia-smi reports it; ``usable_gib`` as CUDA reports its total."""

    total_mib: float
    usable_gib: float

    @property
    def free_at_load_gib(self) -> float:
        """SGLang's ``pre_model_load_memory``: free GiB before the weights are loaded."""
        return self.usable_gib - STARTUP_OVERHEAD_GIB


@dataclass(frozen=True)
class EmulatedDevice:
    """``hardware`` prices one device (scale it for TP); ``memory`` is None for the CPU, which runs
    with SGLang's CPU settings instead of a GPU's."""

    name: str
    hardware: HardwareSpec
    memory: DeviceMemory | None

    def plugin_hardware(self, tp: int) -> str:
        """The plugin's ``hardware`` setting for a TP group of this device: a built-in name the
        cost model resolves (``NAMExTP``), or the profile's path."""
        if self.name in BUILTIN_DEVICES:
            return self.hardware.name if tp == 1 else f"{self.hardware.name}x{tp}"
        return self.name


BUILTIN_DEVICES: dict[str, tuple[str, DeviceMemory | None]] = {
    "h100": ("h100-sxm", DeviceMemory(H100_TOTAL_MIB, H100_USABLE_GIB)),
    "a100-80g": ("a100-80g", DeviceMemory(A100_80G_TOTAL_MIB, A100_80G_USABLE_GIB)),
    CPU_DEVICE: ("cpu", None),
}


def resolve_device(name: str) -> EmulatedDevice:
    """A built-in device, or a profile JSON that also names its memory (`PROFILE_TOTAL_MIB`,
    `PROFILE_USABLE_GIB`)."""
    if name in BUILTIN_DEVICES:
        hardware, memory = BUILTIN_DEVICES[name]
        return EmulatedDevice(name, HardwareSpec.resolve(hardware), memory)
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"unknown device {name!r}: not one of {', '.join(BUILTIN_DEVICES)} nor a profile JSON")
    data = json.loads(path.read_text())
    if PROFILE_TOTAL_MIB not in data or PROFILE_USABLE_GIB not in data:
        raise ValueError(
            f"{path} prices a device but does not say its memory: add {PROFILE_TOTAL_MIB!r} "
            f"(nvidia-smi memory.total) and {PROFILE_USABLE_GIB!r} (torch.cuda.mem_get_info total, GiB)"
        )
    memory = DeviceMemory(float(data[PROFILE_TOTAL_MIB]), float(data[PROFILE_USABLE_GIB]))
    return EmulatedDevice(name, HardwareSpec.from_json(path), memory)
