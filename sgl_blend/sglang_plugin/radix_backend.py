"""A registered radix-cache backend whose nodes carry sgl-blend's annotations.

``--radix-cache-backend sgl-blend`` makes SGLang build this subclass of its own Python
`RadixCache` (the default unified cache keeps its nodes in a Rust core that Python attributes
cannot reach).

- BlendServe: when the offline pool admits a request, every node on its cached prefix path gets
  the compute density the policy planned with (``blend_density``, a running mean over the
  requests that used the node) and, as its eviction ``priority``, the number of offline requests
  still pending under that prefix; ``--radix-eviction-policy priority`` then evicts prefixes
  nobody waits for first, LRU among equals.
- Echo (co-location mode ``echo``): eviction follows Echo's priorities (`core.kv_priority`),
  computed when SGLang evicts rather than stamped at admission, so ``rc`` is always the current
  count of unfinished offline requests sharing the node. A node's reuser handle and its path are
  cached on the node; the path never changes (a split only inserts a parent above it).

SGLang's Python tree ranks every evictable leaf each time it evicts, and a full KV pool evicts
for each allocation: a large batch with many distinct prompts made eviction most of the
scheduler's time. So the backend frees at least `EVICT_SHARE` of the pool when it evicts.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Callable
from typing import Any

from sgl_blend.core.kv_priority import RUNNING_ONLINE, ReuserIndex, kv_priority
from sgl_blend.offline import is_offline
from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.runtime import PluginRuntime

BACKEND_NAME = "sgl-blend"
# The least an eviction frees, as a share of the KV pool (bench.feed_rate; docs/results.md).
EVICT_SHARE = 0.01

ReuserSource = Callable[[], "ReuserIndex | None"]


def annotate_path(node: Any, density: float, pending_reusers: int) -> int:
    """Annotate ``node`` and its ancestors; returns how many nodes were annotated."""
    annotated = 0
    while node is not None and getattr(node, "parent", None) is not None:
        uses = getattr(node, "blend_uses", 0)
        node.blend_density = (getattr(node, "blend_density", 0.0) * uses + density) / (uses + 1)
        node.blend_uses = uses + 1
        node.priority = pending_reusers
        annotated += 1
        node = node.parent
    return annotated


def mark_left_by_online(node: Any) -> None:
    """Mark the path an online request leaves behind (Echo's "finished online" KV)."""
    while node is not None and getattr(node, "parent", None) is not None:
        node.blend_online = True
        node = node.parent


def path_head(node: Any) -> array:
    """Tokens from the root through the first token of ``node``: a request that shares them
    reuses at least part of the node."""
    head = getattr(node, "blend_path_head", None)
    if head is None:
        parts = [node.key.token_ids[:1]]
        ancestor = node.parent
        while ancestor is not None and ancestor.parent is not None:
            parts.append(ancestor.key.token_ids[: len(ancestor.key)])
            ancestor = ancestor.parent
        head = array("q")
        for part in reversed(parts):
            head.extend(part if isinstance(part, array) and part.typecode == "q" else list(part))
        node.blend_path_head = head
    return head


def pending_reusers(node: Any, index: ReuserIndex) -> int:
    cached = getattr(node, "blend_reusers", None)
    if cached is not None:
        handle, version = cached
        if handle is not None and index.is_current(handle):
            return handle.node.count
        if handle is None and version == index.version:
            return 0
    handle = index.locate(path_head(node))
    node.blend_reusers = (handle, index.version)
    return handle.node.count if handle is not None else 0


def echo_node_priority(node: Any, index: ReuserIndex | None) -> float:
    if node.lock_ref > 0:
        return RUNNING_ONLINE
    return kv_priority(
        running_online=False,
        pending_reusers=pending_reusers(node, index) if index is not None else 0,
        left_by_online=getattr(node, "blend_online", False),
    )


def build_cache(params: Any, reusers: ReuserSource | None) -> Any:
    """The backend's cache; with ``reusers`` it evicts by Echo's priorities."""

    class BlendRadixCache(sgl.RadixCache):
        def annotate_path(self, node: Any, density: float, pending: int) -> int:
            return annotate_path(node, density, pending)

        def evict(self, evict_params: Any) -> Any:
            least = int(EVICT_SHARE * self.token_to_kv_pool_allocator.size)
            if 0 < evict_params.num_tokens < least:
                evict_params = dataclasses.replace(evict_params, num_tokens=least)
            return super().evict(evict_params)

        def on_release(self, req: Any, *, checkpointed: bool) -> None:
            super().on_release(req, checkpointed=checkpointed)
            if reusers is not None and checkpointed and not is_offline(req.routing_key):
                mark_left_by_online(req.last_node)

    cache = BlendRadixCache(params)
    if reusers is not None:
        cache.eviction_strategy = echo_eviction(reusers)
    return cache


def echo_eviction(reusers: ReuserSource) -> Any:
    """SGLang's eviction strategy by Echo's priorities, the reusers read from ``reusers`` now."""

    class EchoEviction(sgl.EvictionStrategy):
        def get_priority(self, node: Any) -> tuple[float, float]:
            return echo_node_priority(node, reusers()), node.last_access_time

    return EchoEviction()


def register_backend(runtime: PluginRuntime) -> None:
    """Register the backend, its eviction chosen by the launch settings: Echo's priorities read
    the runtime's offline pool (none until it exists), everything else SGLang's policy."""

    def build(context: Any) -> Any:
        return build_cache(context.params, runtime.reusers if runtime.settings.colocation.kv_priorities else None)

    if sgl.get_radix_cache_factory(BACKEND_NAME) is None:
        sgl.register_radix_cache_backend(BACKEND_NAME, build)
