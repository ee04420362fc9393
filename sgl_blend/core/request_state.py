"""One offline request as a policy tracks it, from submission until it finishes or is withdrawn.

A policy keeps one `RequestState` per request (as SGLang keeps a `Req`): what the engine asked for,
where it stands, and what the policy decided about it, so no second table keyed by the request
can drift from the first. The scan's account of a running request (its side, its charge, its
progress) is the scanner's own `dual_scan.ScanEntry`: the scanner is a component of its own,
driven by a plan's keys alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sgl_blend.core.placement import Placement
from sgl_blend.core.protocol import OfflineRequest


class Status(Enum):
    PENDING = "pending"
    """Waiting for admission: new, or preempted and waiting again."""
    RUNNING = "running"
    """Admitted and not yet finished."""
    DONE = "done"
    """Finished or withdrawn; the policy has forgotten it."""


@dataclass(eq=False, slots=True)
class RequestState:
    """``index`` is the request's dense id in the prefix tree, the estimator and the plans."""

    index: int
    request: OfflineRequest
    sample: bool
    """An output-length sample: it runs before the plan, and its length refines the estimates."""
    status: Status = Status.PENDING
    unplanned: bool = False
    """Submitted since the last plan (samples never are: they wait for no plan)."""
    proposed: str | None = None
    """The side the latest proposal offered it from; None if that proposal left it out."""
    side: str | None = None
    """The side it was admitted to while it runs (the sample side, or a scan side)."""
    reuse: int | None = None
    """Prompt tokens it reuses from the request before it in the current plan; None outside one."""
    computes_from: int | None = None
    """Where the part of its prompt it was the first admitted to compute starts, in tokens (None:
    another request computes all of it). Those tokens are in flight while it prefills, for every
    request that shares them (`PlannedPolicy._prefix_in_flight`). A depth, not the nodes: a later
    arrival sharing part of them splits a node, and the shared upper part is a new node."""

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def placement(self) -> Placement | None:
        return self.request.placement
