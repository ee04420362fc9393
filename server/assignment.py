"""Which worker server runs which lines of a batch.

The runner assigns a batch's unfinished lines whenever it takes the batch up, so a restart with a
different set of workers spreads whatever is left over the workers it has now. An `Assigner` sees
each unfinished line's index row and can read the line itself (``read_line``), so it may spread a
batch by its prompts' shared prefixes as well as by count; it returns each worker's line numbers.
"""

from __future__ import annotations

from typing import Callable, Sequence

from server.store import LineRow

Assignment = dict[str, list[int]]
Assigner = Callable[[Sequence[LineRow], Sequence[str], Callable[[LineRow], bytes]], Assignment]


def split_evenly(lines: Sequence[LineRow], workers: Sequence[str],
                 read_line: Callable[[LineRow], bytes] | None = None) -> Assignment:
    """Contiguous runs of the lines in file order, of near-equal size, one per worker, so that
    neighbouring lines (which often share a prompt prefix) stay on one server."""
    numbers = sorted(line.line_number for line in lines)
    assignment: Assignment = {}
    for index, worker in enumerate(workers):
        start, end = len(numbers) * index // len(workers), len(numbers) * (index + 1) // len(workers)
        if end > start:
            assignment[worker] = numbers[start:end]
    return assignment
