"""Paged KV memory with a radix prefix cache, at the granularity of shared prompt segments.

Shared segments live in the cache as nodes of a radix tree (a segment's hash already names its
whole path). A node is referenced by every running request whose prompt passes through it; one
nobody references stays cached and can be reused until memory is needed, when the least
recently released goes first. Releasing a chain inserts its nodes deepest first, so a child is
always evicted before its parent and the tree never holds an orphan. Sizes are whole pages, as
SGLang allocates them; a running request's private tokens (unique tail and output) are the
engine's.

A segment becomes a hit only from the iteration after the one that inserted it: SGLang inserts a
request's prefix into its radix tree after the forward that computed it, so two requests admitted
in the same iteration with a prefix nobody has computed both compute it (their KV is shared here,
as SGLang's tree dedups it on insert).

When a request finishes, SGLang's radix cache keeps its whole sequence -- unique tail and output
included -- as evictable leaves, not just the shared prefix. No later request reuses those
tokens, but they occupy memory and sit in the same LRU: `retain` inserts them (before the chain
is released, so the leaf goes before its parents). An order that runs a prefix family's requests
far apart then loses the family's prefix to the tails finished in between, which is how
sharing comes to differ between orders.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from sgl_blend.sim.workload import Segment


class _Node:
    __slots__ = ("length", "refs", "ready")

    def __init__(self, length: int, ready: int = 0) -> None:
        self.length = length
        self.refs = 0
        self.ready = ready


class RadixKVCache:
    def __init__(self, page_size: int = 1) -> None:
        self.page_size = page_size
        self.used = 0
        self.evictable = 0
        self.iteration = 0
        self._nodes: dict[str, _Node] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()

    def pages(self, tokens: int) -> int:
        """Tokens rounded up to whole pages: what an allocation really takes."""
        return -(-tokens // self.page_size) * self.page_size

    def advance(self, iterations: int) -> None:
        """The engine ran ``iterations`` forwards: what they computed is in the tree now."""
        self.iteration += iterations

    def cached_prefix(self, prefix: Sequence[Segment]) -> int:
        """Tokens of ``prefix`` already computed and resident, from the start of the chain."""
        hit = 0
        for key, length in prefix:
            node = self._nodes.get(key)
            if node is None or node.ready > self.iteration:
                break
            hit += length
        return hit

    def missing_tokens(self, prefix: Sequence[Segment]) -> int:
        return sum(self.pages(length) for key, length in prefix if key not in self._nodes)

    def acquire(self, prefix: Sequence[Segment]) -> int:
        """Reference every segment of the chain, inserting the missing ones; returns the hit
        tokens. The caller has made room (``evict``) for `missing_tokens` first."""
        hit, hitting = 0, True
        for key, length in prefix:
            node = self._nodes.get(key)
            if node is None:
                hitting = False
                node = self._nodes[key] = _Node(self.pages(length), self.iteration + 1)
                self.used += node.length
            elif hitting and node.ready <= self.iteration:
                hit += length
            else:
                hitting = False
            if node.refs == 0 and key in self._lru:
                del self._lru[key]
                self.evictable -= node.length
            node.refs += 1
        return hit

    def retain(self, key: str, tokens: int) -> int:
        """Keep a finished request's private tokens as an unreferenced, evictable leaf under
        ``key`` (unique to the request); returns the pages it occupies. Call it before releasing
        the request's prefix chain so the leaf is evicted before its parents."""
        if tokens <= 0 or key in self._nodes:
            return 0
        node = self._nodes[key] = _Node(self.pages(tokens))
        self.used += node.length
        self.evictable += node.length
        self._lru[key] = None
        return node.length

    def release(self, prefix: Sequence[Segment]) -> None:
        for key, _length in reversed(prefix):
            node = self._nodes[key]
            node.refs -= 1
            if node.refs == 0:
                self._lru[key] = None
                self.evictable += node.length

    def evict(self, tokens: int) -> int:
        """Drop unreferenced segments, least recently released first, until ``tokens`` are freed
        or none is left; returns the tokens freed."""
        freed = 0
        while freed < tokens and self._lru:
            key, _ = self._lru.popitem(last=False)
            node = self._nodes.pop(key)
            self.used -= node.length
            self.evictable -= node.length
            freed += node.length
        return freed
