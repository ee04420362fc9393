"""The global plan of a batch's lines: the core's plan over their tokenised prompts, a placement
for each line.

The batch runner (behind the Batch API and `sgl-blend run-batch`) plans this way before feeding
the engine, so the scheduler receives lines in plan order, from both ends, each with its
`Placement`. The prompts were tokenised once, with the served model's tokenizer, when the batch
was validated, because the plan's prefix tree must see the prompts the engine will see.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

from sgl_blend.core.batch_plan import BatchPlan, plan_batch
from sgl_blend.core.cost_model import CostModel
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.policy_registry import REGISTRY


class LinePlanner:
    """Plans batch lines for one model on one device. ``blend`` defaults to what the device's
    measured overlap allows (`HardwareSpec.blending_pays`)."""

    def __init__(self, cost_model: CostModel, blend: bool | None = None) -> None:
        self.cost_model = cost_model
        self.blend = cost_model.hardware.blending_pays if blend is None else blend

    @classmethod
    def for_policy(cls, policy: str, cost_model: CostModel) -> LinePlanner | None:
        """The planner an offline policy feeds by (the registry's ``planned`` entries, blending
        where the entry says the device decides); other policies get none."""
        entry = REGISTRY[policy]
        if not entry.planned:
            return None
        return cls(cost_model, blend=None if entry.blends else False)

    def plan(self, items: Sequence[WorkItem], observed: Mapping[Hashable, tuple[WorkItem, int]] | None = None) -> BatchPlan:
        """The plan of ``items``; ``observed`` holds the samples that already ran."""
        return plan_batch(items, self.cost_model, blend=self.blend, observed=observed)
