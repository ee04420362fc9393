"""A job's emulated time, from two readings of an emulated server's clock.

A job that runs between two readings took, on the emulated device, the device time of the forwards
in between plus the time the device sat idle: ``Δdevice_seconds + Δidle_wall_seconds``. Under a
real-time factor (each forward lasts ``wall_per_device_second`` times its price on the wall clock,
`emulation.realtime`) idle wall time is device time stretched by the same factor, so it counts
over that factor. A server
with several DP ranks emulates one device per rank; they run side by side, so the job took as
long as the slowest rank's share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sgl_blend.client.http import server_info
from sgl_blend.emulation.config import EMULATION_KEY, STATE_KEY


@dataclass(frozen=True)
class ClockReading:
    """Each DP rank's emulation state (``/server_info`` → ``internal_states[i].sgl_blend.emulation``)."""

    ranks: Mapping[int, Mapping[str, Any]]

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any]) -> ClockReading:
        """Ranks are keyed by ``sgl_blend.dp_rank`` (``internal_states`` lists them in the order they
        answered); a server that emulates nothing raises."""
        ranks: dict[int, Mapping[str, Any]] = {}
        for index, state in enumerate(info.get("internal_states") or ()):
            plugin = state.get(STATE_KEY) or {}
            if EMULATION_KEY in plugin:
                rank = plugin.get("dp_rank")
                ranks[index if rank is None else int(rank)] = plugin[EMULATION_KEY]
        if not ranks:
            raise ValueError("the server emulates no device (no sgl_blend.emulation in /server_info)")
        return cls(ranks)

    def emulated_seconds(self, rank: int) -> float:
        """Rank ``rank``'s emulated time since its start: device time plus idle time."""
        state = self.ranks[rank]
        return float(state["device_seconds"]) + float(state["idle_wall_seconds"]) / _stretch(state)


def read_clock(base_url: str, api_key: str | None = None) -> ClockReading:
    return ClockReading.from_server_info(server_info(base_url, api_key))


def emulated_seconds(before: ClockReading, after: ClockReading) -> float:
    """Emulated seconds between two readings of the same server: the slowest rank's
    ``Δdevice_seconds + Δidle_wall_seconds``."""
    if set(before.ranks) != set(after.ranks):
        raise ValueError(f"the readings are of different ranks: {sorted(before.ranks)} and {sorted(after.ranks)}")
    return max(after.emulated_seconds(rank) - before.emulated_seconds(rank) for rank in after.ranks)


@dataclass(frozen=True)
class JobTime:
    """A job's emulated time on the slowest rank: ``device_seconds`` of forwards plus
    ``idle_seconds`` the device waited for work while the job still had lines to run.
    ``late_seconds``: how much later than the device the host delivered its batches (device
    seconds; measured only in real time, `emulation.realtime`, else 0): a device fed by this host
    would have waited that long too, which ``seconds_with_lateness`` charges."""

    device_seconds: float
    idle_seconds: float
    late_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        return self.device_seconds + self.idle_seconds

    @property
    def seconds_with_lateness(self) -> float:
        return self.seconds + self.late_seconds


def job_time(before: ClockReading | None, after: ClockReading) -> JobTime:
    """The emulated time of a job that began at ``before`` (None: on a fresh server, at its first
    forward with offline work) and whose last line was answered by ``after``: the idle interval
    under way at ``after`` began when the last forward ended, after the job's work, so it is not
    the job's."""
    if before is not None and set(before.ranks) != set(after.ranks):
        raise ValueError(f"the readings are of different ranks: {sorted(before.ranks)} and {sorted(after.ranks)}")
    times = []
    for rank in after.ranks:
        end = after.ranks[rank]
        start = before.ranks[rank] if before is not None else end.get("job_start") or end
        idle = (
            float(end["idle_wall_seconds"]) - float(end["idle_under_way_seconds"]) - float(start["idle_wall_seconds"])
        )
        late = _behind(end) - _behind(start)
        times.append(
            JobTime(
                float(end["device_seconds"]) - float(start["device_seconds"]),
                max(idle, 0.0) / _stretch(end),
                late / _stretch(end),
            )
        )
    return max(times, key=lambda time: time.seconds_with_lateness)


def _behind(state: Mapping[str, Any]) -> float:
    """Wall seconds the host fell behind the device in real time (0 when forwards return at once)."""
    return float((state.get("realtime") or {}).get("behind_s") or 0.0)


def _stretch(state: Mapping[str, Any]) -> float:
    """Wall seconds per device second (1 unless the emulation runs in real time)."""
    return float(state.get("wall_per_device_second") or 1.0)
