"""An emulated launch: what SGLang loads, the flags it gets and the plugin's settings.

`sgl-blend serve --emulate DEVICE` calls `emulated_launch`, and so does any launcher that wants the
same server (run-batch, benches); it then extends its `PluginSettings` with
`EmulatedLaunch.settings_for`. On a GPU device the server loads a tiny stand-in for a named model
(or the given model directory, its forward skipped) and is sized as a stock SGLang server of that
model on that device (`memory`): the chunked-prefill size, the running-request limit and the KV
pool go in as SGLang flags. ``--tp-size`` is priced, not run: SGLang runs one process, and
``--mem-fraction-static`` only enters the sizing. On ``cpu`` the given model runs for real with
SGLang's CPU settings and every forward is priced beside it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sgl_blend.emulation.config import EmulationConfig
from sgl_blend.emulation.devices import resolve_device
from sgl_blend.emulation.memory import EngineSizing, engine_sizing
from sgl_blend.models.llama31 import EMULATION_MODELS
from sgl_blend.models.registry import STAND_IN, prepare, resolve_model_path

TP_FLAGS = ("--tp-size", "--tensor-parallel-size")
MEM_FRACTION_FLAG = "--mem-fraction-static"
CHUNK_FLAG = "--chunked-prefill-size"
RUNNING_FLAG = "--max-running-requests"
TOKENS_FLAG = "--max-total-tokens"
# The text every skipped forward emits, one ordinary token at a time.
EMULATED_TEXT = " the"


class LaunchSettings(Protocol):
    """The plugin's settings as a launch extends them: `PluginSettings`, which imports this package
    (the plugin reads `EmulationConfig`), so it is named here by what it does."""

    @property
    def hardware(self) -> str | None: ...

    def updated(self, **changes: Any) -> Any: ...


Settings = TypeVar("Settings", bound=LaunchSettings)


@dataclass(frozen=True)
class EmulatedLaunch:
    """``model_path`` is what SGLang loads and ``sglang_args`` its flags; ``emulation`` and
    ``hardware`` go into the plugin's settings (`settings_for`). ``sizing`` is None on the CPU, which
    keeps SGLang's CPU settings."""

    model_path: Path
    sglang_args: list[str]
    emulation: EmulationConfig
    hardware: str
    sizing: EngineSizing | None

    def settings_for(self, settings: Settings) -> Settings:
        """``settings`` with the emulation; their cost-model hardware defaults to the emulated device."""
        return settings.updated(emulation=self.emulation, hardware=settings.hardware or self.hardware)

    def describe(self) -> str:
        emulation = self.emulation
        line = f"emulating {emulation.device} running {emulation.model} at TP {emulation.tp}"
        if self.sizing is None:
            return line + " (real forward, timed and priced)"
        sizing = self.sizing
        return (
            f"{line}: {sizing.max_total_tokens} KV tokens (mem_fraction_static {sizing.mem_fraction_static}), "
            f"chunked prefill {sizing.chunked_prefill_size}, {sizing.max_running_requests} running requests"
        )


def emulated_launch(
    device: str,
    model: str,
    sglang_args: Sequence[str] = (),
    cache_dir: Path | None = None,
    realtime_factor: float | None = None,
) -> EmulatedLaunch:
    """The launch of ``model`` (a name in `EMULATION_MODELS`, a bundled model, or an HF model
    directory) on the emulated ``device``; ``sglang_args`` are the user's SGLang flags;
    ``realtime_factor``: each forward lasts that many times its price on the wall clock."""
    emulated = resolve_device(device)
    args = list(sglang_args)
    if emulated.memory is None:
        if model in EMULATION_MODELS:
            raise ValueError(
                f"--emulate {device} runs the real model, and {model} has no weights here: "
                "give a model that runs (tiny-llama, smollm2-135m or a model directory)"
            )
        path = resolve_model_path(model, cache_dir)
        runs = EmulationConfig(device, str(path), _tp(args), realtime_factor=realtime_factor)
        return EmulatedLaunch(path, args, runs, emulated.plugin_hardware(1), None)
    if model in EMULATION_MODELS:
        path, config = prepare(STAND_IN, cache_dir)[0], EMULATION_MODELS[model]
    else:
        path = resolve_model_path(model, cache_dir)
        config = json.loads((path / "config.json").read_text())
        model = str(path)
    tp = _tp(args)
    sizing = engine_sizing(
        config,
        emulated.memory,
        tp,
        chunked_prefill_size=_int_flag(args, CHUNK_FLAG),
        max_running_requests=_int_flag(args, RUNNING_FLAG),
        mem_fraction_static=_float_flag(args, MEM_FRACTION_FLAG),
        max_total_tokens=_int_flag(args, TOKENS_FLAG),
    )
    args = _without(args, (*TP_FLAGS, MEM_FRACTION_FLAG, CHUNK_FLAG, RUNNING_FLAG, TOKENS_FLAG)) + [
        CHUNK_FLAG,
        str(sizing.chunked_prefill_size),
        RUNNING_FLAG,
        str(sizing.max_running_requests),
        TOKENS_FLAG,
        str(sizing.max_total_tokens),
    ]
    return EmulatedLaunch(
        path,
        args,
        EmulationConfig(device, model, tp, emulated_token(path), realtime_factor),
        emulated.plugin_hardware(tp),
        sizing,
    )


def emulated_token(model_path: Path) -> int:
    """The id of `EMULATED_TEXT` in the model's tokenizer: one ordinary, non-special token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    ids = tokenizer.encode(EMULATED_TEXT, add_special_tokens=False)
    if len(ids) != 1 or ids[0] in tokenizer.all_special_ids:
        raise ValueError(f"{model_path}'s tokenizer has no single ordinary token for {EMULATED_TEXT!r} (got {ids})")
    return ids[0]


def _flag(argv: Sequence[str], flags: Sequence[str]) -> str | None:
    """The value of the last of ``flags`` in argv, ``--flag value`` or ``--flag=value``, as argparse
    reads it (`launch.flags.flag_value` does the same for one name, but `launch` stands above the
    plugin, which imports this package)."""
    value = None
    for index, arg in enumerate(argv):
        name, equals, inline = arg.partition("=")
        if name in flags:
            value = inline if equals else (argv[index + 1] if index + 1 < len(argv) else None)
    return value


def _tp(argv: Sequence[str]) -> int:
    return int(_flag(argv, TP_FLAGS) or 1)


def _int_flag(argv: Sequence[str], flag: str) -> int | None:
    value = _flag(argv, (flag,))
    return None if value is None else int(value)


def _float_flag(argv: Sequence[str], flag: str) -> float | None:
    value = _flag(argv, (flag,))
    return None if value is None else float(value)


def _without(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """argv less every ``flags`` entry and its value."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg.partition("=")[0] in flags:
            skip = "=" not in arg
        else:
            kept.append(arg)
    return kept
