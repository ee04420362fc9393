"""The global plan of a batch's lines: the core's plan over their tokenised prompts, a placement
for each line.

The batch runner (behind the Batch API and `sgl-blend run-batch`) plans this way before feeding
the engine, so the scheduler receives lines in plan order, from both ends, each with its
`Placement`. The prompts were tokenised once, with the served model's tokenizer, when the batch
was validated, because the plan's prefix tree must see the prompts the engine will see.

A runner plans more than once (what it has validated so far, then everything unsent, again when
the output-length samples are back or a batch joins), and lines of an earlier plan may still wait
in the engine when the next plan's lines arrive. `RankSpace` keeps every plan's positions in one
rank space: each plan's compute side is numbered after every earlier compute side and its memory
side below every earlier memory side, so the engine's pool, which scans the compute side from its
lowest position and the memory side from its highest, takes what it already holds first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from sgl_blend.core.batch_plan import BatchPlan, K, plan_batch
from sgl_blend.core.cost_model import CostModel
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.output_length import DEFAULT_SAMPLE_RATE
from sgl_blend.core.placement import MEMORY, Placement
from sgl_blend.core.policy_registry import REGISTRY

# The memory side's positions count down from here, far above any compute side's.
MEMORY_TOP = 2**40


class LinePlanner:
    """Plans batch lines for one model on one device. ``blend`` defaults to what the device's
    measured overlap allows (`HardwareSpec.blending_pays`); ``one_cursor`` places every line on
    the compute side, to be walked from its compute-heavy end (an ablation's plan)."""

    def __init__(self, cost_model: CostModel, blend: bool | None = None, one_cursor: bool = False) -> None:
        self.cost_model = cost_model
        self.blend = cost_model.hardware.blending_pays if blend is None else blend
        self.one_cursor = one_cursor

    @classmethod
    def for_policy(cls, policy: str, cost_model: CostModel) -> LinePlanner | None:
        """The planner an offline policy feeds by (the registry's ``planned`` entries, blending
        where the entry says the device decides, with one cursor where it says so); other
        policies get none."""
        entry = REGISTRY[policy]
        if not entry.planned:
            return None
        return cls(cost_model, blend=None if entry.blends else False, one_cursor=entry.one_cursor)

    def plan(
        self,
        items: Sequence[WorkItem[K]],
        observed: Mapping[K, tuple[WorkItem, int]] | None = None,
        sample_rate: float | None = None,
    ) -> BatchPlan[K]:
        """The plan of ``items``; ``observed`` holds the samples that already ran; ``sample_rate``
        None keeps the core's default (0: choose no samples)."""
        rate = DEFAULT_SAMPLE_RATE if sample_rate is None else sample_rate
        return plan_batch(
            items, self.cost_model, blend=self.blend, one_cursor=self.one_cursor, observed=observed, sample_rate=rate
        )


class RankSpace:
    """Positions for successive plans of one runner, in one rank space."""

    def __init__(self) -> None:
        self.next_compute = 0
        self.next_memory = MEMORY_TOP

    def take_compute(self) -> int:
        """One position ahead of every later plan's compute side (an output-length sample's)."""
        self.next_compute += 1
        return self.next_compute - 1

    def continue_after(self, placements: Iterable[Placement]) -> None:
        """Go on after the positions of a stored plan (a runner taken up again)."""
        for placement in placements:
            if placement.side == MEMORY:
                self.next_memory = min(self.next_memory, placement.position - 1)
            else:
                self.next_compute = max(self.next_compute, placement.position + 1)

    def place(self, plan: BatchPlan[K], prompts: Mapping[K, str] | None = None) -> dict[K, Placement]:
        """``plan``'s placements renumbered after every earlier plan's, each with the digest of the
        prompt ids it was planned on (``prompts``, by key) where given."""
        prompts = prompts or {}
        memory = [key for key, placement in plan.placements.items() if placement.side == MEMORY]
        top = max((plan.placements[key].position for key in memory), default=0)
        placed: dict[K, Placement] = {}
        for key, placement in plan.placements.items():
            if placement.side == MEMORY:
                position = self.next_memory - (top - placement.position)
            else:
                position = self.next_compute + placement.position
            placed[key] = dataclasses.replace(placement, position=position, prompt=prompts.get(key))
        self.next_compute += len(plan.placements) - len(memory)
        self.next_memory -= len(memory)
        return placed
