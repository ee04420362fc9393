"""BROS's bidirectional KV layout (§V) as a token-to-slot allocator.

Device KV memory is ``blocks × block_size`` slots. A block holds at most one real-time (RT)
request, growing from its left end, and one best-effort (BE) request, growing from its right
end, so each side of a block is one contiguous run. A request grows in its last block while
slots are free there, then claims the block with the most free slots that has no owner on its
side.

When an RT request finds no free slot it takes slots of a BE request that is not running this
iteration -- first the BE neighbour in its own last block, then the BE-only block with the most
BE slots. Only the BE tokens about to be overwritten are copied to host memory (lazy
checkpoint) and noted in the preemption table; when the BE request runs again they are copied
back into whatever slots are free, since at page size 1 a request's token-to-slot map may point
anywhere. If that is still not enough, whole requests go to host memory, in the order the
caller gives (BE first, then RT by most remaining time).

``bidirectional=False`` is the comparison the paper makes ("No Bi-cache"): a block has a single
owner, and an RT request short of memory drops a whole BE request, which recomputes its KV.

Slots are plain integers; a `KVStore` moves the bytes (SGLang's KV pool in the server, plain
tensors in the tests), so the allocator itself never touches KV data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

NO_OWNER = -1
ON_HOST = -1


class KVStore(Protocol):
    def copy_out(self, slots: Sequence[int]) -> Any:
        """The KV of ``slots`` (every layer), copied to host memory."""

    def copy_in(self, slots: Sequence[int], saved: Any) -> None:
        """Write KV saved by `copy_out` into ``slots``."""


@dataclass
class _Layout:
    """One request's token-to-slot map (``ON_HOST`` where the token sits in host memory)."""

    owner: int
    realtime: bool
    slots: list[int] = field(default_factory=list)
    tail: int = NO_OWNER
    host: list[tuple[list[int], Any]] = field(default_factory=list)
    dropped: int = 0
    resident: int = 0

    @property
    def host_tokens(self) -> int:
        return sum(len(positions) for positions, _ in self.host)


@dataclass(frozen=True)
class Preemption:
    """A block where an RT request overwrote slots of a BE request."""

    block: int
    realtime: str
    best_effort: str
    slots: int


class BidirectionalKV:
    def __init__(self, blocks: int, block_size: int, store: KVStore | None = None, bidirectional: bool = True) -> None:
        if blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {blocks} × {block_size}")
        self.block_size = block_size
        self.store = store
        self.bidirectional = bidirectional
        self.rt_owner = np.full(blocks, NO_OWNER, dtype=np.int64)
        self.be_owner = np.full(blocks, NO_OWNER, dtype=np.int64)
        self.rt_fill = np.zeros(blocks, dtype=np.int64)
        self.be_fill = np.zeros(blocks, dtype=np.int64)
        self.preemptions: list[Preemption] = []
        self._layouts: dict[str, _Layout] = {}
        self._rids: dict[int, str] = {}
        self._next_owner = 0

    @property
    def capacity(self) -> int:
        return len(self.rt_fill) * self.block_size

    @property
    def free_slots(self) -> int:
        return self.capacity - int(self.rt_fill.sum() + self.be_fill.sum())

    def claimable_slots(self, realtime: bool) -> int:
        """Free slots a newcomer of a class can claim: those in blocks with no owner on its
        side (no owner at all in single-owner mode). Free slots beside another request's run
        of the same class are only that request's to grow into, so Alg. 1 must not count them."""
        usable = (self.rt_owner if realtime else self.be_owner) == NO_OWNER
        if not self.bidirectional:
            usable &= (self.rt_owner == NO_OWNER) & (self.be_owner == NO_OWNER)
        return int((self.block_size - self.rt_fill - self.be_fill)[usable].sum())

    def own_room(self) -> dict[str, int]:
        """Free slots in each request's last block, which it alone grows into."""
        return {
            rid: self._room(layout.tail)
            for rid, layout in self._layouts.items()
            if layout.tail != NO_OWNER and self._room(layout.tail) > 0
        }

    def slots(self, rid: str) -> list[int]:
        return list(self._layouts[rid].slots) if rid in self._layouts else []

    def resident(self, rid: str) -> int:
        layout = self._layouts.get(rid)
        return layout.resident if layout else 0

    def host_tokens(self, rid: str) -> int:
        layout = self._layouts.get(rid)
        return layout.host_tokens if layout else 0

    def take_dropped(self, rid: str) -> int:
        """Tokens of ``rid`` discarded since the last call (recompute mode), and forget them."""
        layout = self._layouts.get(rid)
        if layout is None:
            return 0
        dropped, layout.dropped = layout.dropped, 0
        return dropped

    def best_effort_resident(self, exclude: Iterable[str] = ()) -> dict[str, int]:
        """Device slots of each BE request an RT request could take (Alg. 1's memory view)."""
        skip = set(exclude)
        return {
            rid: layout.resident
            for rid, layout in self._layouts.items()
            if not layout.realtime and rid not in skip and layout.resident
        }

    def _layout(self, rid: str, realtime: bool) -> _Layout:
        layout = self._layouts.get(rid)
        if layout is None:
            layout = _Layout(self._next_owner, realtime)
            self._rids[self._next_owner] = rid
            self._next_owner += 1
            self._layouts[rid] = layout
        elif layout.realtime != realtime:
            raise ValueError(f"request {rid!r} already has slots as {'RT' if layout.realtime else 'BE'}")
        return layout

    def allocate(
        self, rid: str, count: int, realtime: bool, protect: Iterable[str] = (), evict_order: Iterable[str] = ()
    ) -> list[int] | None:
        """Slots for ``count`` new tokens of ``rid``, in token order; None (and nothing
        changed for ``rid``) when they cannot be found. ``protect`` are requests running this
        iteration, whose KV must stay put; ``evict_order`` are whole requests that may go to
        host memory, first to last, when an RT request finds nothing else (read lazily, so a
        generator costs nothing unless it is needed)."""
        layout = self._layout(rid, realtime)
        claimed = self._claim(layout, count, set(protect) | {rid}, evict_order)
        if claimed is None:
            return None
        layout.slots.extend(claimed)
        return claimed

    def restore(self, rid: str, protect: Iterable[str] = (), evict_order: Iterable[str] = ()) -> list[int] | None:
        """Bring ``rid``'s checkpointed tokens back into free slots (an RT request may make room
        as `allocate` does); returns the slots used."""
        layout = self._layouts[rid]
        count = layout.host_tokens
        if count == 0:
            return []
        claimed = self._claim(layout, count, set(protect) | {rid}, evict_order)
        if claimed is None:
            return None
        cursor = 0
        for positions, saved in layout.host:
            target = claimed[cursor : cursor + len(positions)]
            if self.store is not None:
                self.store.copy_in(target, saved)
            for position, slot in zip(positions, target):
                layout.slots[position] = slot
            cursor += len(positions)
        layout.host = []
        self.preemptions = [p for p in self.preemptions if p.best_effort != rid]
        return claimed

    def release(self, rid: str) -> None:
        """A finished (or aborted) request gives back every slot it holds."""
        layout = self._layouts.pop(rid, None)
        if layout is None:
            return
        self._free(layout, [slot for slot in layout.slots if slot != ON_HOST])
        del self._rids[layout.owner]
        self.preemptions = [p for p in self.preemptions if rid not in (p.realtime, p.best_effort)]

    def evict(self, rid: str) -> int:
        """Move all of ``rid``'s device-resident tokens to host memory (or drop them in
        recompute mode); returns how many left the device."""
        layout = self._layouts[rid]
        positions = [position for position, slot in enumerate(layout.slots) if slot != ON_HOST]
        self._checkpoint(layout, positions)
        return len(positions)

    def _checkpoint(self, layout: _Layout, positions: list[int]) -> None:
        if not positions:
            return
        slots = [layout.slots[position] for position in positions]
        if self.bidirectional:
            saved = self.store.copy_out(slots) if self.store is not None else None
            layout.host.append((positions, saved))
            for position in positions:
                layout.slots[position] = ON_HOST
            self._free(layout, slots)
            return
        layout.dropped += len(layout.slots)
        self._free(layout, [slot for slot in layout.slots if slot != ON_HOST])
        layout.slots, layout.host, layout.tail = [], [], NO_OWNER

    def _free(self, layout: _Layout, slots: list[int]) -> None:
        blocks, counts = np.unique(np.asarray(slots, dtype=np.int64) // self.block_size, return_counts=True)
        fill, owner = (self.rt_fill, self.rt_owner) if layout.realtime else (self.be_fill, self.be_owner)
        fill[blocks] -= counts
        layout.resident -= len(slots)
        emptied = blocks[fill[blocks] == 0]
        owner[emptied] = NO_OWNER
        if layout.tail in set(emptied.tolist()):
            layout.tail = NO_OWNER

    def _claim(self, layout: _Layout, count: int, protect: set[str], evict_order: Iterable[str]) -> list[int] | None:
        claimed: list[int] = []
        evictions = iter(evict_order)
        while len(claimed) < count:
            block = self._next_block(layout)
            if block is None and layout.realtime:
                block = self._take_over(layout, protect, count - len(claimed))
            while block is None and layout.realtime:
                victim = next((rid for rid in evictions if rid not in protect and rid in self._layouts), None)
                if victim is None:
                    break
                self.evict(victim)
                block = self._next_block(layout)
            if block is None:
                if claimed:
                    self._free(layout, claimed)
                return None
            claimed.extend(self._fill(layout, block, count - len(claimed)))
        return claimed

    def _room(self, block: int) -> int:
        return self.block_size - int(self.rt_fill[block] + self.be_fill[block])

    def _next_block(self, layout: _Layout) -> int | None:
        """The request's last block while it has room, else the roomiest block free on its side."""
        if layout.tail != NO_OWNER and self._room(layout.tail) > 0:
            return layout.tail
        room = self.block_size - self.rt_fill - self.be_fill
        own_side = self.rt_owner if layout.realtime else self.be_owner
        usable = own_side == NO_OWNER
        if not self.bidirectional:
            usable &= (self.rt_owner == NO_OWNER) & (self.be_owner == NO_OWNER)
        candidates = np.where(usable, room, 0)
        block = int(np.argmax(candidates))
        return block if candidates[block] > 0 else None

    def _fill(self, layout: _Layout, block: int, wanted: int) -> list[int]:
        take = min(wanted, self._room(block))
        start = block * self.block_size
        if layout.realtime:
            first = int(self.rt_fill[block])
            slots = list(range(start + first, start + first + take))
            self.rt_fill[block] += take
            self.rt_owner[block] = layout.owner
        else:
            first = self.block_size - int(self.be_fill[block])
            slots = list(range(start + first - 1, start + first - 1 - take, -1))
            self.be_fill[block] += take
            self.be_owner[block] = layout.owner
        layout.tail = block
        layout.resident += take
        return slots

    def _take_over(self, layout: _Layout, protect: set[str], wanted: int) -> int | None:
        """Make room for ``wanted`` RT tokens in a block with a BE tenant outside ``protect``:
        the request's own last block first, else the BE-only block with the most BE slots. In
        bidirectional mode only the BE slots about to be overwritten -- the innermost ones -- are
        checkpointed; otherwise the whole BE request is dropped."""
        protected = [self._layouts[rid].owner for rid in protect if rid in self._layouts]
        takeable = (self.be_owner != NO_OWNER) & ~np.isin(self.be_owner, protected)
        block = None
        if self.bidirectional and layout.tail != NO_OWNER and takeable[layout.tail]:
            block = layout.tail
        else:
            candidates = np.where(takeable & (self.rt_owner == NO_OWNER), self.be_fill, 0)
            if candidates.max(initial=0) > 0:
                block = int(np.argmax(candidates))
        if block is None:
            return None
        victim = self._layouts[self._rids[int(self.be_owner[block])]]
        if not self.bidirectional:
            self._checkpoint(victim, list(range(len(victim.slots))))
            return block
        taken = min(wanted, int(self.be_fill[block]))
        innermost = block * self.block_size + self.block_size - int(self.be_fill[block])
        overwritten = set(range(innermost, innermost + taken))
        self._checkpoint(victim, [position for position, slot in enumerate(victim.slots) if slot in overwritten])
        self.preemptions.append(Preemption(block, self._rids[layout.owner], self._rids[victim.owner], taken))
        return block
