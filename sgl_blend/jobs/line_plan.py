"""The global plan of a job's lines: tokenise them all, plan them with the core, place each line.

`sgl-blend run-batch` and the Batch API runner both plan this way before feeding the engine, so
the scheduler receives lines in plan order, from both ends, each with its `Placement`. Lines are
tokenised with the served model's tokenizer in batches (its fast tokenizer), because the plan's
prefix tree must see the prompts the engine will see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Hashable, Mapping, Sequence

from sgl_blend.jobs.lines import BatchLine
from sgl_blend.core.batch_plan import BatchPlan, plan_batch
from sgl_blend.core.cost_model import CostModel, HardwareSpec, ModelSpec
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.policy_registry import REGISTRY
from sgl_blend.jobs.line_work import LineTokenizer, output_bound

TOKENIZE_CHUNK = 4096


class LinePlanner:
    """Plans batch lines for one model on one device. ``blend`` defaults to what the device's
    measured overlap allows (`HardwareSpec.blending_pays`)."""

    def __init__(self, model_path: str | Path, hardware: HardwareSpec, blend: bool | None = None) -> None:
        self.tokenizer = LineTokenizer(model_path)
        self.cost_model = CostModel(ModelSpec.from_hf_dir(model_path), hardware)
        self.blend = hardware.blending_pays if blend is None else blend

    def work_items(self, lines: Mapping[Hashable, BatchLine]) -> dict[Hashable, WorkItem]:
        keys = list(lines)
        items: dict[Hashable, WorkItem] = {}
        for start in range(0, len(keys), TOKENIZE_CHUNK):
            chunk = keys[start:start + TOKENIZE_CHUNK]
            for key, ids in zip(chunk, self.tokenizer.prompt_ids_batch([lines[key] for key in chunk])):
                bound, exact = output_bound(lines[key].body)
                items[key] = WorkItem(key, ids, bound, exact)
        return items

    @classmethod
    def for_policy(cls, policy: str, model_path: str | Path, hardware: HardwareSpec) -> LinePlanner | None:
        """The planner an offline policy feeds by: ``blendserve`` blends where the device allows,
        ``dfs`` is the exact global DFS order; other policies get none."""
        if not REGISTRY[policy].planned:
            return None
        return cls(model_path, hardware, blend=None if policy == "blendserve" else False)

    def plan(self, items: Sequence[WorkItem], observed: Mapping[Hashable, tuple[WorkItem, int]] | None = None) -> BatchPlan:
        """The plan of ``items``; ``observed`` holds the samples that already ran."""
        return plan_batch(items, self.cost_model, blend=self.blend, observed=observed)
