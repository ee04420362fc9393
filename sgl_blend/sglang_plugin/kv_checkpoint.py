"""Lazy checkpoint of a held request's newest KV to host memory, and its restore (BROS §V in SGLang).

When a real-time request takes KV slots from a best-effort request that is held back
(`held_decodes`), only the slots it takes are copied to host memory: the request's newest tokens
(the innermost slots of its run, `sgl_blend.core.bros.takeover`), through the KV pool's own
per-slot host copy (``get_cpu_copy``/``load_cpu_copy``: every layer's K and V buffer at those slot
indices, the pair SGLang's ``cpu_tensor`` retraction backup uses), and the slots go back to
SGLang's allocator. The request's committed and allocated KV lengths shrink by as many tokens, so
to the rest of SGLang it owns a shorter KV prefix: releasing it (a client abort, a result that
finishes it) frees exactly what it still holds. The preemption table keeps, per request, each
take's first position and host copy. When the request is scheduled again, `restore` allocates
fresh slots, copies the KV back into them, writes them into the request's ``req_to_token`` row at
those positions and restores the lengths, so it decodes on exactly where it was.

Page size 1 only (bros mode's default): at larger pages a take would split a page another token
of the request still uses. Tokens inside the prefix the radix cache holds for the request are
never taken (they are the tree's).

Why the bidirectional layout (`core.bros.bidirectional_kv`) is not SGLang's token-to-KV allocator:
SGLang asks its allocator for a count of slots per batch (``alloc_token_slots`` for a prefill,
``alloc_for_decode`` for every decode row at once) and only afterwards writes which request got
which slot into ``req_to_token``; the allocator never learns the request, let alone whether it is
real-time or best-effort, so it cannot put RT runs at a block's left end and BE runs at its right.
The allocator class is chosen by pool type inside ``KVCacheConfigurator`` with no registry to
supply another, and its free list is read directly by the capacity checks (``available_size``,
``check_decode_capacity``, ``PrefillBudget``) and written by every free path (request release,
retraction, radix eviction, over-allocation). Making the layout the allocator would mean replacing
the allocation functions, the free paths and the capacity checks: a fork of SGLang's memory
management, not a plugin. And at page size 1 the attention kernels read KV through
``req_to_token`` alone, so where a request's slots lie changes nothing; what the layout decides
that does matter -- which BE request gives, how many slots, its newest tokens, copied lazily --
is kept here on SGLang's own free list.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.held_decodes import resident_tokens


@dataclass
class _Take:
    """Positions ``first .. first + tokens - 1`` of a request, copied to host."""

    first: int
    tokens: int
    saved: Any


class KVCheckpoint:
    """The preemption table: per request, the takes whose KV sits in host memory."""

    def __init__(self) -> None:
        self._table: dict[str, list[_Take]] = {}
        self.counts = {
            "checkpoints": 0,
            "checkpointed_tokens": 0,
            "restores": 0,
            "restored_tokens": 0,
            "discarded_tokens": 0,
        }

    def host_tokens(self, rid: str) -> int:
        return sum(take.tokens for take in self._table.get(rid, ()))

    def snapshot(self) -> dict[str, Any]:
        return {
            "host_tokens": sum(self.host_tokens(rid) for rid in self._table),
            "checkpointed_now": len(self._table),
            **self.counts,
        }

    def take(self, scheduler: Any, req: Any, tokens: int) -> int:
        """Copy ``req``'s newest ``tokens`` (at most what it may give) to host and free their slots;
        returns how many were taken."""
        import torch

        tokens = min(tokens, resident_tokens(req))
        if tokens <= 0:
            return 0
        if scheduler.page_size != 1:
            raise ValueError(f"KV takeover needs page size 1, the server runs {scheduler.page_size}")
        end = int(req.kv.kv_committed_len)
        first = end - tokens
        slots = scheduler.req_to_token_pool.req_to_token[req.kv.req_pool_idx, first:end].to(torch.int64)
        allocator = scheduler.token_to_kv_pool_allocator
        saved = allocator.get_cpu_copy(slots)
        allocator.free(slots)
        req.kv.kv_committed_len -= tokens
        req.kv.kv_allocated_len -= tokens
        self._table.setdefault(req.rid, []).append(_Take(first, tokens, saved))
        self.counts["checkpoints"] += 1
        self.counts["checkpointed_tokens"] += tokens
        return tokens

    def restore(self, scheduler: Any, req: Any) -> bool:
        """Bring ``req``'s checkpointed KV back into free slots; False (nothing changed) when the
        pool has too few. True when nothing of it is left on host."""
        import torch

        takes = self._table.get(req.rid)
        if not takes:
            return True
        count = sum(take.tokens for take in takes)
        allocator = scheduler.token_to_kv_pool_allocator
        sgl.evict_from_tree_cache(scheduler.tree_cache, count)
        slots = allocator.alloc(count)
        if slots is None:
            return False
        start = int(req.kv.kv_committed_len)
        for take in takes:
            offset = take.first - start
            allocator.load_cpu_copy(take.saved, slots[offset : offset + take.tokens])
        scheduler.req_to_token_pool.write((req.kv.req_pool_idx, slice(start, start + count)), slots.to(torch.int32))
        req.kv.kv_committed_len += count
        req.kv.kv_allocated_len += count
        del self._table[req.rid]
        self.counts["restores"] += 1
        self.counts["restored_tokens"] += count
        return True

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the host copies of requests no longer held (finished or aborted meanwhile)."""
        alive = set(keep)
        for rid in [rid for rid in self._table if rid not in alive]:
            self.counts["discarded_tokens"] += self.host_tokens(rid)
            del self._table[rid]

    def rids(self) -> Sequence[str]:
        return list(self._table)
