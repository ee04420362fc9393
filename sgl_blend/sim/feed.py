"""How a job's lines reach the simulated scheduler: as the batch runner behind run-batch and the
Batch API feeds them (`server.planning`, `server.dispatch`).

- A planned order (``blendserve``, ``dfs`` and their ablations): output-length samples -- a seeded
  share of the lines whose length is not fixed, when the plan blends -- are sent first; every other
  line is planned at once over the whole batch (`LinePlanner`, the runner's planner) and sent in
  the plan's feed order with its `Placement`; once every sample is back, the lines not yet sent
  are planned again with the samples' lengths, their positions numbered after the first plan's
  (`RankSpace`), so the scheduler's pool takes what it already holds first.
- Any other order: file order, no placement (the engine's own policy orders what it holds).
- A window: at most ``window`` lines sent and not finished (`runner_window`).

The window and the samples are the runner's own rules (`server.window`, `server.planning`); the
simulated job is named by its seed where the runner names a batch by its id.

Planning takes no device time here: the runner plans in a thread while the engine runs, and on
the emulated engine its wall time shows up only as idle time before the first line arrives.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol

from sgl_blend.batch_lines.plan import LinePlanner, RankSpace
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.placement import Placement
from sgl_blend.core.protocol import OfflineRequest
from sgl_blend.server.planning import is_sample, sample_placement
from sgl_blend.server.window import concurrent_requests, line_footprint, lines_in_flight
from sgl_blend.sim.workload import SimRequest


class RunningLimit(Protocol):
    """A simulated engine's configuration, as far as the runner's window reads it."""

    @property
    def max_running(self) -> int: ...


def runner_window(requests: Sequence[SimRequest], config: RunningLimit, kv_capacity: int) -> int:
    """Lines in flight, as the runner sizes its window for an engine of ``kv_capacity`` tokens and
    ``config.max_running`` requests."""
    if not requests:
        return 1
    footprint = sum(line_footprint(r.prompt_len, r.max_new_tokens) for r in requests) / len(requests)
    return lines_in_flight(concurrent_requests(kv_capacity, config.max_running, footprint))


class RunnerFeed:
    """The batch runner's feed of ``requests`` (in file order) through a ``window``; ``planner``
    None sends in file order. ``seed`` picks the output-length samples."""

    def __init__(self, requests: Sequence[SimRequest], planner: LinePlanner | None, window: int, seed: int = 0) -> None:
        if window < 1:
            raise ValueError("the window must hold at least one line")
        self.line_planner = planner
        self.window = window
        self.items = (
            {index: WorkItem(index, r.prompt_ids(), r.max_new_tokens, r.exact) for index, r in enumerate(requests)}
            if planner is not None
            else {}
        )
        self.requests = requests
        self.index = {request.rid: index for index, request in enumerate(requests)}
        self.placements: dict[int, Placement] = {}
        self.ranks = RankSpace()
        self.samples: set[int] = set()
        self.observed: dict[int, tuple[WorkItem, int]] = {}
        self.inflight = 0
        self.plans = 0
        if planner is None:
            self.queue = deque(range(len(requests)))
            return
        self.samples = {
            index for index, item in self.items.items() if planner.blend and is_sample(str(seed), index + 1, item)
        }
        for index in sorted(self.samples):
            self.placements[index] = sample_placement(self.ranks.take_compute(), self.items[index])
        self.queue = deque(sorted(self.samples))
        self._plan([index for index in range(len(requests)) if index not in self.samples])

    def _plan(self, unsent: list[int]) -> None:
        """Plan the unsent lines and queue them in the plan's order behind the lines still queued
        that the plan does not cover (samples)."""
        if not unsent:
            return
        assert self.line_planner is not None, "a feed without a planner queues every line at once"
        plan = self.line_planner.plan([self.items[index] for index in unsent], self.observed or None, sample_rate=0.0)
        self.placements.update(self.ranks.place(plan))
        covered = set(unsent)
        self.queue = deque([index for index in self.queue if index not in covered] + list(plan.feed))
        self.plans += 1

    def _send(self) -> list[OfflineRequest]:
        sent = []
        while self.queue and self.inflight < self.window:
            index = self.queue.popleft()
            request = self.requests[index]
            sent.append(
                OfflineRequest(
                    request.rid, request.prompt_ids(), request.max_new_tokens, request.exact, self.placements.get(index)
                )
            )
            self.inflight += 1
        return sent

    def start(self) -> Iterable[OfflineRequest]:
        return self._send()

    def finished(self, rid: str, output_len: int) -> Iterable[OfflineRequest]:
        """A line is back: its slot in the window is free; a sample's length is observed, and once
        every sample is back the unsent lines are planned again with their lengths."""
        self.inflight -= 1
        index = self.index[rid]
        if index in self.samples:
            self.samples.discard(index)
            self.observed[index] = (self.items[index], output_len)
            if not self.samples:
                self._plan(list(self.queue))
        return self._send()
