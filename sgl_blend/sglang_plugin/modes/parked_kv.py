"""Offline work sent back to the waiting queue keeps its KV pinned in the radix cache until it returns.

A parked offline decode is held out of the batch with its KV resident (`held_decodes`); other
offline work still goes back to the waiting queue with its KV checkpointed into the radix cache:
an offline chunked prefill under way when online requests wait (SGLang carries one chunked request
at a time, and the online prompt needs the slot), a running offline request whose request slot an
online request needs, and a decode that cannot be held (speculative decoding, beam search,
encoder-decoder models). Left at that, the checkpoint is an ordinary
evictable cache entry, and an online burst evicts it: the request then recomputes everything
(HyGen §4.3: preempted offline requests keep their state). So such a park takes a tree lock on the
node the checkpoint ended on; the lock goes when

- the request is admitted again (its own admission has locked the same path by then),
- the co-location plan deliberately drops parked KV because online demand needs the memory
  (`IterationPlan.unpin_tokens`, newest parked first: the oldest is closest to resuming),
- or the request left the waiting queue without resuming (aborted by its client).

A preemption for memory does not pin: that KV is given back on purpose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class ParkedRequest:
    kept_tokens: int
    lock: Any
    tree_cache: Any


class ParkedKV:
    def __init__(self) -> None:
        self._parked: dict[str, ParkedRequest] = {}
        self.dropped_tokens = 0

    def __len__(self) -> int:
        return len(self._parked)

    def pinned_tokens(self) -> int:
        return sum(parked.kept_tokens for parked in self._parked.values() if parked.lock is not None)

    def park(self, req: Any, tree_cache: Any, kept_tokens: int, pin: bool) -> None:
        """Called after SGLang checkpointed ``req`` into the tree (``req.last_node`` is where the
        insert ended) and before the request is reset for its return to the queue."""
        self.unpin(req.rid)
        lock = tree_cache.lock(req.last_node) if pin and req.last_node is not None else None
        self._parked[req.rid] = ParkedRequest(kept_tokens, lock, tree_cache)

    def resumed(self, rid: str) -> int | None:
        """The request was admitted again: its pin goes; returns the tokens it had kept."""
        parked = self._parked.pop(rid, None)
        if parked is None:
            return None
        self._release(parked)
        return parked.kept_tokens

    def unpin(self, rid: str) -> None:
        parked = self._parked.get(rid)
        if parked is not None:
            self._release(parked)

    def drop_newest(self, tokens: int) -> int:
        """Unpin parked KV, newest parked first, until ``tokens`` are evictable; returns how many."""
        freed = 0
        for parked in reversed(list(self._parked.values())):
            if freed >= tokens:
                break
            if parked.lock is not None:
                self._release(parked)
                freed += parked.kept_tokens
        self.dropped_tokens += freed
        return freed

    def forget_missing(self, waiting: Callable[[str], bool]) -> int:
        """Unpin and forget parked requests no longer waiting (aborted while parked)."""
        gone = [rid for rid in self._parked if not waiting(rid)]
        for rid in gone:
            self._release(self._parked.pop(rid))
        return len(gone)

    @staticmethod
    def _release(parked: ParkedRequest) -> None:
        if parked.lock is not None:
            parked.tree_cache.unlock(parked.lock)
            parked.lock = None
