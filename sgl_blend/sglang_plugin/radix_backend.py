"""A registered radix-cache backend whose nodes carry BlendServe's annotations.

``--radix-cache-backend sgl-blend`` makes SGLang build this subclass of its own Python
`RadixCache` (the default unified cache keeps its nodes in a Rust core that Python attributes
cannot reach). When the offline pool admits a request, every node on its cached prefix path gets
the compute density the policy planned with (``blend_density``, a running mean over the
requests that used the node) and, as its eviction ``priority``, the number of offline requests
still pending under that prefix. With ``--radix-eviction-policy priority`` a prefix that queued
work will reuse is therefore evicted after prefixes nobody is waiting for, LRU among equals.
"""

from __future__ import annotations

from typing import Any

BACKEND_NAME = "sgl-blend"


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


def _build(context: Any) -> Any:
    from sglang.srt.mem_cache.radix_cache import RadixCache

    cache = RadixCache(context.params)
    cache.annotate_path = annotate_path
    return cache


def register_backend() -> None:
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(BACKEND_NAME) is None:
        register_radix_cache_backend(BACKEND_NAME, _build)
