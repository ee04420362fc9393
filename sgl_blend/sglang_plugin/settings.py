"""What a launcher tells the plugin in SGLang's scheduler: one typed value, one environment variable.

SGLang starts its scheduler in processes of its own and passes them nothing of ours but the
environment, so every launcher (`sgl-blend serve`, `run-batch`, `tune-slo`, the latency profiler,
the benches and tests) builds a `PluginSettings` and passes ``to_env()``; the plugin's `register`
reads it back with `from_env`. One variable, validated on both sides, means a launcher cannot set
half of the settings or misspell one, and a malformed value is refused with a message that names
it instead of being half-read. Importing this module does not import SGLang.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.cost_model import CostModel, HardwareSpec, ModelSpec, model_spec
from sgl_blend.core.policy_registry import REGISTRY, SERVE, lookup
from sgl_blend.core.policy_worker import WORKER_KINDS
from sgl_blend.cpu_compat import cuda_present
from sgl_blend.emulation.config import EmulationConfig

SETTINGS_ENV = "SGLBLEND_SETTINGS"
Flags = tuple[tuple[str, str | None], ...]
MIXED_CHUNK: Flags = (("--enable-mixed-chunk", None),)
# BlendServe's tree annotations and Echo's KV priorities live in the plugin's radix cache.
ANNOTATED_CACHE: Flags = (("--radix-cache-backend", "sgl-blend"),)
# Two scan sides keep two prefix families warm: evict first the prefixes no pending line reuses.
PRIORITY_EVICTION: Flags = (("--radix-eviction-policy", "priority"),)
# BROS's KV layout assumes each request owns its slots, so bros mode runs without the radix cache.
NO_RADIX_CACHE: Flags = (("--disable-radix-cache", None),)
OFF = "off"
DEFAULT_POLICY = "blendserve"
DEFAULT_HARDWARE = "a100-80g"
CPU_HARDWARE = "cpu"


class SettingsError(ValueError):
    """The settings variable, or a value in it, cannot be used."""


@dataclass(frozen=True)
class PluginSettings:
    """``offline_policy`` orders offline work in the plugin's pool (``off``: no pool, SGLang's own
    ``--schedule-policy`` orders everything). ``hardware`` names the cost model's device (a
    built-in name or an `sgl-blend profile` JSON; None: `configured_hardware`'s default).
    ``psm_utility`` is HyGen's anti-starvation utility for the ``psm`` policy (None: its default).
    ``record_policy_calls`` keeps every call the scheduler makes on the policy, for replay in the
    simulator. ``policy_worker`` is where the policy plans, one step ahead of the scheduler loop
    (`core.policy_worker`: ``process``, ``thread``, or ``inline`` in the loop itself).
    ``iteration_log``, when set, is a JSONL file every per-iteration record is
    appended to (what `sgl-blend profile --latency` fits on). ``emulation``, when set, replaces
    the model forward with one priced on an emulated device (`sgl_blend.emulation`)."""

    offline_policy: str = DEFAULT_POLICY
    hardware: str | None = None
    psm_utility: float | None = None
    record_policy_calls: bool = False
    policy_worker: str = "process"
    colocation: ColocationConfig = field(default_factory=ColocationConfig)
    iteration_log: str | None = None
    emulation: EmulationConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.offline_policy, str):
            raise SettingsError(f"offline_policy must be a policy name, got {self.offline_policy!r}")
        try:
            lookup(self.offline_policy, SERVE)
        except ValueError as error:
            raise SettingsError(f"offline_policy: {error}") from None
        for name in ("hardware", "iteration_log"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise SettingsError(f"{name} must be a non-empty string or null, got {value!r}")
        utility = self.psm_utility
        if utility is not None and not (
            isinstance(utility, (int, float)) and not isinstance(utility, bool) and 0.0 <= utility <= 1.0
        ):
            raise SettingsError(f"psm_utility must be a number in [0, 1] or null, got {utility!r}")
        if not isinstance(self.record_policy_calls, bool):
            raise SettingsError(f"record_policy_calls must be true or false, got {self.record_policy_calls!r}")
        if self.policy_worker not in WORKER_KINDS:
            raise SettingsError(f"policy_worker must be one of {', '.join(WORKER_KINDS)}, got {self.policy_worker!r}")
        if not isinstance(self.colocation, ColocationConfig):
            raise SettingsError(f"colocation must be a ColocationConfig, got {self.colocation!r}")
        if self.emulation is not None and not isinstance(self.emulation, EmulationConfig):
            raise SettingsError(f"emulation must be an EmulationConfig or null, got {self.emulation!r}")

    @property
    def pool_enabled(self) -> bool:
        """Whether the plugin's pool orders offline work; for SGLang's own orders it stays out."""
        return REGISTRY[self.offline_policy].in_plugin

    def sglang_flags(self) -> Flags:
        """The SGLang flags this configuration runs with, as defaults a user's own flag overrides.

        Mixed prefill/decode batches wherever offline work is ordered (by the plugin's pool or by
        SGLang's own order it is compared with: every policy gets the same engine knobs, as the
        simulator models them) and wherever online and offline work share iterations; SGLang's
        ``--schedule-policy`` that the registry names for the policy; and the radix-cache backend
        and eviction a blending plan or a co-location mode needs. ``off`` adds nothing."""
        entry = REGISTRY[self.offline_policy]
        flags: list[tuple[str, str | None]] = []
        mode = self.colocation.mode if self.colocation.enabled else None
        if entry.name != OFF or mode:
            flags += MIXED_CHUNK
        if entry.sglang_schedule and entry.name != OFF:
            flags.append(("--schedule-policy", entry.sglang_schedule))
        if mode == "bros":
            flags += NO_RADIX_CACHE
        elif mode:
            flags += ANNOTATED_CACHE
        elif entry.blends and self.device().blending_pays:
            flags += ANNOTATED_CACHE + PRIORITY_EVICTION
        return tuple(flags)

    def priced_model(self, model_path: str) -> ModelSpec:
        """The model the cost model prices: the emulated one when emulating (SGLang then runs a
        tiny stand-in at ``model_path``), else the served model itself."""
        return model_spec(self.emulation.model if self.emulation is not None else model_path)

    def cost_model(self, model_path: str, tp_size: int = 1) -> CostModel:
        """The cost model the plugin's pool and the batch planner price with."""
        return CostModel(self.priced_model(model_path), self.device(tp_size))

    def device(self, tp_size: int = 1) -> HardwareSpec:
        """The cost model's device as one scheduler of a ``tp_size``-wide TP group sees it."""
        return configured_hardware(tp_size, self.hardware)

    def updated(self, **changes: Any) -> PluginSettings:
        return replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def to_env(self) -> dict[str, str]:
        """The one variable a server process needs, for ``env.update``."""
        return {SETTINGS_ENV: self.to_json()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PluginSettings:
        if not isinstance(data, Mapping):
            raise SettingsError(f"expected a JSON object, got {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
        values = dict(data)
        colocation = values.pop("colocation", None)
        if colocation is not None:
            if not isinstance(colocation, Mapping):
                raise SettingsError(f"colocation must be a JSON object, got {colocation!r}")
            try:
                values["colocation"] = ColocationConfig.from_dict(dict(colocation))
            except (TypeError, ValueError) as error:
                raise SettingsError(f"colocation: {error}") from None
        emulation = values.pop("emulation", None)
        if emulation is not None:
            if not isinstance(emulation, Mapping):
                raise SettingsError(f"emulation must be a JSON object, got {emulation!r}")
            try:
                values["emulation"] = EmulationConfig.from_dict(emulation)
            except (TypeError, ValueError) as error:
                raise SettingsError(f"emulation: {error}") from None
        return cls(**values)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginSettings:
        """The settings a launcher passed (the defaults when it passed none)."""
        text = (os.environ if environ is None else environ).get(SETTINGS_ENV)
        if not text:
            return cls()
        try:
            return cls.from_dict(json.loads(text))
        except ValueError as error:
            raise SettingsError(f"{SETTINGS_ENV} is not valid plugin settings ({error}): {text[:200]!r}") from None


def configured_hardware(tp_size: int = 1, name: str | None = None) -> HardwareSpec:
    """The device ``name`` as one scheduler sees it: a TP group of ``tp_size`` devices has that
    many times the compute, bandwidth and KV memory of one. Without a name the default is the
    measured ``cpu`` profile when there is no CUDA (its overlap makes BlendServe order by prefix
    with one cursor), else an A100."""
    default = DEFAULT_HARDWARE if cuda_present() else CPU_HARDWARE
    return HardwareSpec.resolve(name or default).scaled(tp_size)
