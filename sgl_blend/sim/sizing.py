"""The engine a simulation runs: what a stock SGLang server picks for the model on the device.

The emulated engine (`sgl_blend.emulation`) is sized by `emulation.memory.engine_sizing` -- SGLang's
own formulas for the KV pool, the chunked-prefill size and the running-request limit on that
device -- and each forward is priced by the device's `HardwareSpec` at the model's shapes. A
simulation takes the same three limits and the same price, so a simulated and an emulated run of
one batch model one engine. ``chunk``, ``max_running`` and ``kv_tokens`` are the SGLang flags a
user may give (``--chunked-prefill-size``, ``--max-running-requests``, ``--max-total-tokens``),
honoured as SGLang honours them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sgl_blend.core.cost_model import HardwareSpec, ModelSpec, model_spec
from sgl_blend.emulation.devices import resolve_device
from sgl_blend.emulation.memory import EngineSizing, engine_sizing
from sgl_blend.models.llama31 import EMULATION_MODELS
from sgl_blend.sim.engine import EngineConfig


@dataclass(frozen=True)
class StockEngine:
    """``hardware`` prices a forward (a TP group of the device); ``config`` holds the engine's limits."""

    model: ModelSpec
    hardware: HardwareSpec
    config: EngineConfig
    sizing: EngineSizing


def stock_engine(
    model: str,
    device: str,
    tp: int = 1,
    *,
    hardware: HardwareSpec | None = None,
    chunk: int | None = None,
    max_running: int | None = None,
    kv_tokens: int | None = None,
) -> StockEngine:
    """``model``: ``llama-3.1-8b``, ``llama-3.1-70b`` or an HF model directory; ``device``: ``h100``,
    ``a100-80g`` or a profile JSON that names its memory (`emulation.devices`); ``hardware``
    prices forwards instead of the device's own spec (a measured profile)."""
    emulated = resolve_device(device)
    if emulated.memory is None:
        raise ValueError(f"{device} is not a GPU: the simulator sizes an engine from a GPU's memory")
    if model in EMULATION_MODELS:
        config = EMULATION_MODELS[model]
    else:
        config = json.loads((Path(model) / "config.json").read_text())
    sizing = engine_sizing(
        config,
        emulated.memory,
        tp,
        chunked_prefill_size=chunk,
        max_running_requests=max_running,
        max_total_tokens=kv_tokens,
    )
    limits = EngineConfig(
        kv_capacity=sizing.max_total_tokens,
        token_budget=sizing.chunked_prefill_size,
        max_running=sizing.max_running_requests,
    )
    return StockEngine(model_spec(model), (hardware or emulated.hardware).scaled(tp), limits, sizing)
