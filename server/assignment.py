"""Which worker server runs which lines of a batch.

The runner assigns a batch's unfinished lines whenever it takes the batch up, so a restart with a
different set of workers re-spreads whatever is left. `Assigner` is the seam for spreading a batch
by its prefix tree instead of by line count.
"""

from __future__ import annotations

from typing import Callable, Sequence

# (worker base URL, first line number, last line number), both ends included.
WorkerRange = tuple[str, int, int]
Assigner = Callable[[Sequence[int], Sequence[str]], list[WorkerRange]]


def split_evenly(line_numbers: Sequence[int], workers: Sequence[str]) -> list[WorkerRange]:
    """Contiguous runs of ``line_numbers`` (ascending) of near-equal size, one per worker, so that
    neighbouring lines (which often share a prompt prefix) stay on one server."""
    if not line_numbers or not workers:
        return []
    ranges: list[WorkerRange] = []
    start = 0
    for index, worker in enumerate(workers):
        end = len(line_numbers) * (index + 1) // len(workers)
        if end > start:
            ranges.append((worker, line_numbers[start], line_numbers[end - 1]))
        start = end
    return ranges
