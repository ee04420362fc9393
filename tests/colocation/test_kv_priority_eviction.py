"""Echo's eviction priorities on SGLang's own RadixCache (the `sgl-blend` backend) with a real
token allocator and no server: lower priority goes first, LRU among equals, locked (running)
paths never, and ``rc`` follows the offline requests as they arrive and finish."""

from __future__ import annotations

from array import array

import pytest
import torch

from sgl_blend.core.kv_priority import FINISHED_ONLINE, ReuserIndex, kv_priority
from sgl_blend.offline import offline_routing_key

LEAF = 4
LONG_AGO = -1e9  # before any time.monotonic() reading


@pytest.fixture()
def cache_and_index():
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    from sgl_blend.sglang_plugin.radix_backend import build_cache

    allocator = TokenToKVPoolAllocator(256, torch.float32, "cpu", None, False)
    index = ReuserIndex()
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                             page_size=1, eviction_policy="lru")
    return build_cache(params, lambda: index), index


def insert(cache, first: int):
    """A leaf of LEAF tokens under the root, starting with token ``first``. Its last access is set
    to ``LONG_AGO + first``: leaves starting with larger tokens are younger (a defined LRU order,
    whatever the clock's resolution), and any access SGLang stamps later is younger still."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    tokens = array("q", range(first, first + LEAF))
    result = cache.insert(InsertParams(key=RadixKey(tokens), value=cache.token_to_kv_pool_allocator.alloc(LEAF)))
    node = result.last_device_node
    node.last_access_time = LONG_AGO + first
    return node


def release_online(cache, node) -> None:
    """What SGLang does when an online request finishes: the tree keeps its KV, then on_release."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req("online-1", "", array("q", [1]), SamplingParams())
    req.last_node = node
    cache.on_release(req, checkpointed=True)


def in_tree(node) -> bool:
    return any(child is node for child in node.parent.children.values())


def eviction_order(cache, leaves: dict[str, object]) -> list[str]:
    """Evict one token at a time (SGLang frees a whole leaf) and note which leaf went."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    order = []
    while True:
        present = {name for name, node in leaves.items() if in_tree(node)}
        if not cache.evict(EvictParams(num_tokens=1)).num_tokens_evicted:
            return order
        order += sorted(name for name in present if not in_tree(leaves[name]))


def test_priorities_order_lru_and_locks(cache_and_index) -> None:
    cache, index = cache_and_index
    leaves = {name: insert(cache, 10 * position) for position, name in
              enumerate(["dead-old", "running-online", "rc3", "finished-online", "rc1", "dead-new"])}
    for reuser in range(3):
        index.add(f"r3-{reuser}", list(range(20, 20 + LEAF)) + [99, reuser])
    index.add("r1", list(range(40, 40 + LEAF)) + [7])
    release_online(cache, leaves["finished-online"])
    cache.inc_lock_ref(leaves["running-online"])
    assert eviction_order(cache, leaves) == ["dead-old", "dead-new", "finished-online", "rc1", "rc3"]
    assert in_tree(leaves["running-online"])


def test_reuser_counts_follow_arrivals_and_finishes(cache_and_index) -> None:
    cache, index = cache_and_index
    leaves = {"a": insert(cache, 0), "b": insert(cache, 100)}
    index.add("a-1", list(range(0, LEAF)))
    index.add("a-2", list(range(0, LEAF)))
    index.add("b-1", list(range(100, 100 + LEAF)))
    assert [cache.eviction_strategy.get_priority(leaves[n])[0] for n in "ab"] == [2.0, 1.0]
    index.remove("a-1")
    index.remove("a-2")
    index.add("b-2", list(range(100, 100 + LEAF)) + [5])
    assert [cache.eviction_strategy.get_priority(leaves[n])[0] for n in "ab"] == [0.0, 2.0]
    assert eviction_order(cache, leaves) == ["a", "b"]


def test_priority_values_are_echos() -> None:
    assert kv_priority(running_online=True, pending_reusers=0, left_by_online=False) == float("inf")
    assert kv_priority(running_online=False, pending_reusers=4, left_by_online=True) == 4.0
    assert kv_priority(running_online=False, pending_reusers=0, left_by_online=True) == FINISHED_ONLINE
    assert kv_priority(running_online=False, pending_reusers=0, left_by_online=False) == 0.0


def test_offline_release_does_not_mark_online(cache_and_index) -> None:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    cache, _index = cache_and_index
    node = insert(cache, 0)
    req = Req("offline-1", "", array("q", [1]), SamplingParams(), routing_key=offline_routing_key("job"))
    req.last_node = node
    cache.on_release(req, checkpointed=True)
    assert cache.eviction_strategy.get_priority(node)[0] == 0.0
