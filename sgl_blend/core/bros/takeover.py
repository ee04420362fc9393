"""Which best-effort (BE) KV a real-time (RT) request takes when it is short of memory, for an
engine whose slots are not laid out in blocks (SGLang at page size 1).

`BidirectionalKV._take_over` decides on blocks: a BE request outside the batch is the victim, the
block holding the most BE slots first, and only its innermost slots -- the newest tokens of the BE
run, since BE grows from the block's right end -- are checkpointed, no more than are wanted.
Without blocks the same decision reads per request:

- BE requests already held back (not running this iteration) give first, then running ones (the
  task's "held, then running"; a running one is held back before it gives, since it cannot decode
  without its KV);
- within each group, the request holding the most takeable slots first (the roomiest block);
- a victim gives its newest tokens (the innermost slots), and no more than are still wanted.

RT requests are never taken from: when BE slots are not enough the RT request waits, as Alg. 1's
ledger expects (it counts only BE slots as takeable, `packing._Ledger`). Restoring follows
`BidirectionalKV.restore`: the checkpointed tokens come back into any free slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Take:
    """Take up to ``tokens`` of ``rid``'s newest KV; ``running``: hold it back first."""

    rid: str
    tokens: int
    running: bool


def plan_takeover(wanted: int, held: Mapping[str, int], running: Mapping[str, int]) -> list[Take]:
    """The takes that free ``wanted`` slots, or as many as the BE requests have (``held`` and
    ``running`` map each BE request to the slots it could give). Empty when nothing is wanted."""
    takes: list[Take] = []
    left = wanted
    for pool, is_running in ((held, False), (running, True)):
        for rid, slots in sorted(pool.items(), key=lambda item: (-item[1], item[0])):
            if left <= 0:
                return takes
            if slots <= 0:
                continue
            tokens = min(slots, left)
            takes.append(Take(rid, tokens, is_running))
            left -= tokens
    return takes
