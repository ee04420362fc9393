"""Echo's KV-cache eviction priorities (Echo §4.2), and the reuser counts they need.

Lower priority is evicted first, least recently used first among equals:

- KV of a running online request: ∞ (its path is locked while it runs, so it is never a candidate);
- an offline prefix with pending reusers: ``rc``, how many unfinished offline requests share it;
- KV left by a finished online request: 0.5 (a later online turn may reuse it);
- KV of offline work nobody will reuse: 0.

`ReuserIndex` answers "how many unfinished offline requests share this cached prefix" in O(1) per
cached node once located: it keeps the unfinished offline prompts in the project's `PrefixTree`,
whose node counts stay exact as requests come and go, and hands out handles to those nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sgl_blend.core.prefix_tree import Node, PrefixTree

RUNNING_ONLINE = math.inf
FINISHED_ONLINE = 0.5
DEAD_OFFLINE = 0.0


def kv_priority(*, running_online: bool, pending_reusers: int, left_by_online: bool) -> float:
    """The eviction priority of one cached segment."""
    if running_online:
        return RUNNING_ONLINE
    if pending_reusers > 0:
        return float(pending_reusers)
    return FINISHED_ONLINE if left_by_online else DEAD_OFFLINE


@dataclass(frozen=True, slots=True)
class ReuserHandle:
    """Where a cached prefix ends in the index's tree; the node's live count is the answer."""

    node: Node
    start: int


class ReuserIndex:
    """Unfinished offline prompts, counted per shared prefix.

    A handle stays valid while its node is attached and unsplit; removals only lower the live
    count, so only an insert (`version` moves) can make a "nobody shares this" answer stale.
    """

    def __init__(self) -> None:
        self.tree = PrefixTree()
        self._ids: dict[str, int] = {}
        self._next = 0
        self.version = 0

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, rid: str) -> bool:
        return rid in self._ids

    def add(self, rid: str, prompt_ids: Sequence[int]) -> None:
        if rid in self._ids or not prompt_ids:
            return
        self._ids[rid] = self._next
        self.tree.insert(self._next, prompt_ids, 0.0, 0.0)
        self._next += 1
        self.version += 1

    def remove(self, rid: str) -> None:
        index = self._ids.pop(rid, None)
        if index is not None:
            self.tree.remove(index)

    def locate(self, tokens: Sequence[int]) -> ReuserHandle | None:
        """The node holding the last of ``tokens`` on the path of the prompts that start with all
        of them, or None when no unfinished prompt does."""
        path, matched, _covered = self.tree.match(tokens)
        node = path[-1]
        return ReuserHandle(node, node.start) if matched == len(tokens) and node is not self.tree.root else None

    def is_current(self, handle: ReuserHandle) -> bool:
        node = handle.node
        parent = node.parent
        return (
            parent is not None and node.start == handle.start and parent.children.get(node.source[node.start]) is node
        )

    def reusers(self, tokens: Sequence[int]) -> int:
        handle = self.locate(tokens)
        return handle.node.count if handle is not None else 0
