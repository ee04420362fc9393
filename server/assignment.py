"""Which worker server, and which data-parallel rank inside it, runs which lines of a batch.

The runner assigns a batch's unfinished lines whenever it takes the batch up, and again when a
worker dies, so whatever is left is spread over the workers alive at that moment. A worker server
started with ``--dp-size N`` offers N slots, one per DP rank; a line assigned to a rank is sent
with SGLang's ``routed_dp_rank`` so that SGLang's own DP controller puts it there. An `Assigner`
sees the line numbers to place and the prompts validation tokenised (line number -> `WorkItem`;
empty when nothing was tokenised), so it may spread a batch by its prompts' shared
prefixes as well as by count; it returns each slot's lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sgl_blend.core.cost_model import CostModel
from sgl_blend.core.dp_shares import WorkItem, plan_shares


@dataclass(frozen=True, order=True)
class Slot:
    """A place a line runs: a worker's base URL, and the DP rank in it (None: a server with one
    scheduler, or one whose DP controller should choose)."""

    worker: str
    dp_rank: int | None = None


def worker_slots(worker: str, dp_size: int) -> list[Slot]:
    return [Slot(worker)] if dp_size <= 1 else [Slot(worker, rank) for rank in range(dp_size)]


Assignment = dict[Slot, list[int]]
Assigner = Callable[[Sequence[int], Sequence[Slot], Mapping[int, WorkItem]], Assignment]


def split_evenly(
    lines: Sequence[int], slots: Sequence[Slot], prompts: Mapping[int, WorkItem] | None = None
) -> Assignment:
    """Contiguous runs of the lines (by line number) in file order, of near-equal size, one per
    slot, so that neighbouring lines (which often share a prompt prefix) stay together."""
    numbers = sorted(lines)
    assignment: Assignment = {}
    for index, slot in enumerate(slots):
        start, end = len(numbers) * index // len(slots), len(numbers) * (index + 1) // len(slots)
        if end > start:
            assignment[slot] = numbers[start:end]
    return assignment


class PrefixAssigner:
    """BlendServe's DP partition (paper §5.5) as an `Assigner`: one prefix tree over the lines,
    planned and cut into balanced shares of whole subtrees, one share per slot. Lines without a
    prompt (invalid ones, which cost nothing) are spread by count."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model

    def __call__(self, lines: Sequence[int], slots: Sequence[Slot], prompts: Mapping[int, WorkItem]) -> Assignment:
        if len(slots) <= 1:
            return split_evenly(lines, slots)
        placed = [prompts[number] for number in lines if number in prompts]
        rest = [number for number in lines if number not in prompts]
        shares = plan_shares(placed, len(slots), self.cost_model).shares
        assignment: Assignment = {slot: share for slot, share in zip(slots, shares) if share}
        for slot, numbers in split_evenly(rest, slots).items():
            assignment.setdefault(slot, []).extend(numbers)
        return assignment
