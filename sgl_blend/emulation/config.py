"""What the plugin in SGLang's scheduler is told about an emulated device: one typed value.

It travels inside `PluginSettings` (the ``emulation`` field) as JSON, so it is validated on both
sides like the rest of the settings. Importing this module does not import SGLang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

CPU_DEVICE = "cpu"
# Where ``/server_info`` shows the clock: ``internal_states[i][STATE_KEY][EMULATION_KEY]``, inside
# the plugin's own entry (`sglang_plugin.internal_state.STATE_KEY`).
STATE_KEY = "sgl_blend"
EMULATION_KEY = "emulation"


# `--emulate-realtime`, on `serve` and `run-batch` alike.
REALTIME_HELP = (
    "with --emulate: each forward lasts FACTOR times its price on the wall clock, so that this host's "
    "feeding, tokenising and scheduling keep their pace against the device's, as on a real one (the "
    "emulated time counts idle wall time over FACTOR); without it a forward returns at once"
)


@dataclass(frozen=True)
class EmulationConfig:
    """``device`` prices each forward (``h100``, ``a100-80g``, ``cpu`` or a profile JSON; see
    `devices`); ``model`` is the shape it is priced at (a name in `EMULATION_MODELS` or an HF model
    directory); ``tp`` the TP degree it is priced with, whatever SGLang itself runs.
    ``token_id`` is the token a skipped forward returns for every request: on ``cpu`` the real
    forward runs and is timed, so there is none. ``realtime_factor``, when set, makes each skipped
    forward last ``realtime_factor`` times its price on the wall clock (`realtime`); None keeps the
    clock virtual (a forward returns at once)."""

    device: str
    model: str
    tp: int = 1
    token_id: int | None = None
    realtime_factor: float | None = None

    def __post_init__(self) -> None:
        for name in ("device", "model"):
            value = getattr(self, name)
            if not (isinstance(value, str) and value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if not (isinstance(self.tp, int) and not isinstance(self.tp, bool) and self.tp >= 1):
            raise ValueError(f"tp must be a positive integer, got {self.tp!r}")
        if self.runs_model:
            if self.token_id is not None:
                raise ValueError("the cpu device runs the real forward: it takes no token_id")
        elif not (isinstance(self.token_id, int) and not isinstance(self.token_id, bool) and self.token_id >= 0):
            raise ValueError(
                f"an emulated {self.device} needs the token id skipped forwards return, got {self.token_id!r}"
            )
        if self.realtime_factor is not None:
            if self.runs_model:
                raise ValueError(
                    "the cpu device runs the real forward in real time already: it takes no realtime_factor"
                )
            if not (
                isinstance(self.realtime_factor, (int, float))
                and not isinstance(self.realtime_factor, bool)
                and self.realtime_factor > 0
            ):
                raise ValueError(f"realtime_factor must be a positive number, got {self.realtime_factor!r}")

    @property
    def runs_model(self) -> bool:
        """Whether the real forward runs (and is timed) beside its price."""
        return self.device == CPU_DEVICE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EmulationConfig:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown emulation settings: {', '.join(sorted(unknown))}")
        return cls(**data)
