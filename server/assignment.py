"""Which worker server, and which data-parallel rank inside it, runs which lines of a batch.

The runner assigns a batch's unfinished lines whenever it takes the batch up, and again when a
worker dies, so whatever is left is spread over the workers alive at that moment. A worker server
started with ``--dp-size N`` offers N slots, one per DP rank; a line assigned to a rank is sent
with SGLang's ``routed_dp_rank`` so that SGLang's own DP controller puts it there. An `Assigner`
sees each unfinished line's index row and can read the line itself (``read_line``), so it may
spread a batch by its prompts' shared prefixes as well as by count; it returns each slot's lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from sgl_blend.jobs.lines import SUPPORTED_URLS, BatchLine, parse_line
from sgl_blend.jobs.line_work import LinePartitioner
from sgl_blend.server.store import LineRow


@dataclass(frozen=True, order=True)
class Slot:
    """A place a line runs: a worker's base URL, and the DP rank in it (None: a server with one
    scheduler, or one whose DP controller should choose)."""

    worker: str
    dp_rank: int | None = None


def worker_slots(worker: str, dp_size: int) -> list[Slot]:
    return [Slot(worker)] if dp_size <= 1 else [Slot(worker, rank) for rank in range(dp_size)]


Assignment = dict[Slot, list[int]]
Assigner = Callable[[Sequence[LineRow], Sequence[Slot], Callable[[LineRow], bytes]], Assignment]


def split_evenly(lines: Sequence[LineRow], slots: Sequence[Slot],
                 read_line: Callable[[LineRow], bytes] | None = None) -> Assignment:
    """Contiguous runs of the lines in file order, of near-equal size, one per slot, so that
    neighbouring lines (which often share a prompt prefix) stay together."""
    numbers = sorted(line.line_number for line in lines)
    assignment: Assignment = {}
    for index, slot in enumerate(slots):
        start, end = len(numbers) * index // len(slots), len(numbers) * (index + 1) // len(slots)
        if end > start:
            assignment[slot] = numbers[start:end]
    return assignment


def parse_rows(rows: Sequence[LineRow], read_line: Callable[[LineRow], bytes],
               urls: tuple[str, ...]) -> tuple[list[tuple[LineRow, BatchLine]], list[LineRow]]:
    """The stored lines that will run, each with its parsed line, and those that fail without
    running (marked invalid at validation, or not parsing now)."""
    runnable: list[tuple[LineRow, BatchLine]] = []
    invalid: list[LineRow] = []
    for row in rows:
        parsed = None if row.error_code else parse_line(read_line(row).decode("utf-8", "replace"),
                                                        row.line_number, urls)
        if isinstance(parsed, BatchLine):
            runnable.append((row, parsed))
        else:
            invalid.append(row)
    return runnable, invalid


class PrefixAssigner:
    """BlendServe's DP partition (paper §5.5) as an `Assigner`: one prefix tree over the lines,
    planned and cut into balanced shares of whole subtrees, one share per slot. Lines that will
    not run (invalid ones) cost nothing and are spread by count."""

    def __init__(self, partitioner: LinePartitioner) -> None:
        self.partitioner = partitioner

    def __call__(self, lines: Sequence[LineRow], slots: Sequence[Slot],
                 read_line: Callable[[LineRow], bytes]) -> Assignment:
        if len(slots) <= 1:
            return split_evenly(lines, slots)
        parsed, invalid = parse_rows(lines, read_line, SUPPORTED_URLS)
        shares = self.partitioner.shares([line for _row, line in parsed], len(slots))
        assignment: Assignment = {slot: share for slot, share in zip(slots, shares) if share}
        for slot, numbers in split_evenly(invalid, slots).items():
            assignment.setdefault(slot, []).extend(numbers)
        return assignment
