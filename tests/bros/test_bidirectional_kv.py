"""The bidirectional KV allocator on real torch tensors standing in for a KV pool."""

from __future__ import annotations

from typing import Sequence

import pytest
import torch

from sgl_blend.core.bros.bidirectional_kv import ON_HOST, BidirectionalKV

S = 8


class TensorKVStore:
    """A `KVStore` over torch tensors of shape ``[slots, ...]`` (one per layer and K/V), the
    stand-in for SGLang's KV pool."""

    def __init__(self, buffers: Sequence[torch.Tensor]) -> None:
        self.buffers = list(buffers)

    def copy_out(self, slots: Sequence[int]) -> list[torch.Tensor]:
        index = torch.as_tensor(list(slots), dtype=torch.long, device=self.buffers[0].device)
        return [buffer.index_select(0, index).to("cpu") for buffer in self.buffers]

    def copy_in(self, slots: Sequence[int], saved: list[torch.Tensor]) -> None:
        index = torch.as_tensor(list(slots), dtype=torch.long, device=self.buffers[0].device)
        for buffer, data in zip(self.buffers, saved):
            buffer.index_copy_(0, index, data.to(buffer.device))


def pool(blocks: int, bidirectional: bool = True) -> tuple[BidirectionalKV, list[torch.Tensor]]:
    """Two layers of K and V, 2 heads × 4 dims per slot, like SGLang's per-layer buffers."""
    buffers = [torch.zeros(blocks * S, 2, 4) for _ in range(4)]
    return BidirectionalKV(blocks, S, TensorKVStore(buffers), bidirectional), buffers


def write(buffers: list[torch.Tensor], slots: list[int], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for buffer in buffers:
        buffer[slots] = torch.randn(len(slots), 2, 4, generator=generator)


def gather(buffers: list[torch.Tensor], slots: list[int]) -> list[torch.Tensor]:
    return [buffer[slots].clone() for buffer in buffers]


def check_sides(kv: BidirectionalKV) -> None:
    """Every block: one RT run from the left, one BE run from the right, no overlap, each owned
    by at most one request of its class, and the fills match the requests' maps."""
    owners: dict[int, set[tuple[str, bool]]] = {}
    for rid in list(kv._layouts):
        layout = kv._layouts[rid]
        for slot in layout.slots:
            if slot != ON_HOST:
                owners.setdefault(slot // S, set()).add((rid, layout.realtime))
    for block in range(len(kv.rt_fill)):
        realtime = {rid for rid, rt in owners.get(block, ()) if rt}
        best_effort = {rid for rid, rt in owners.get(block, ()) if not rt}
        assert len(realtime) <= 1 and len(best_effort) <= 1, f"block {block} holds {owners[block]}"
        assert kv.rt_fill[block] + kv.be_fill[block] <= S
        for rid in realtime:
            occupied = sorted(s % S for s in kv._layouts[rid].slots if s != ON_HOST and s // S == block)
            assert occupied == list(range(kv.rt_fill[block]))
        for rid in best_effort:
            occupied = sorted(s % S for s in kv._layouts[rid].slots if s != ON_HOST and s // S == block)
            assert occupied == list(range(S - kv.be_fill[block], S))


def test_realtime_fills_from_the_left_and_best_effort_from_the_right_of_a_shared_block() -> None:
    kv, _ = pool(1)
    assert kv.allocate("rt", 3, realtime=True) == [0, 1, 2]
    assert kv.allocate("be", 2, realtime=False) == [7, 6]
    assert kv.allocate("rt", 2, realtime=True) == [3, 4]
    assert kv.allocate("be", 1, realtime=False) == [5]
    assert kv.free_slots == 0
    check_sides(kv)


def test_a_block_never_takes_a_second_request_of_the_same_class() -> None:
    kv, _ = pool(3)
    kv.allocate("rt-a", 2, realtime=True)
    kv.allocate("be-a", 2, realtime=False)
    kv.allocate("rt-b", 2, realtime=True)
    kv.allocate("be-b", 2, realtime=False)
    kv.allocate("rt-c", 20, realtime=True)
    check_sides(kv)
    blocks = {rid: {slot // S for slot in kv.slots(rid)} for rid in ("rt-a", "rt-b", "be-a", "be-b")}
    assert blocks["rt-a"].isdisjoint(blocks["rt-b"]) and blocks["be-a"].isdisjoint(blocks["be-b"])
    assert kv.allocate("be-c", 30, realtime=False) is None
    assert kv.slots("be-c") == []


def test_realtime_takes_only_the_overwritten_best_effort_slots_and_restore_is_byte_identical() -> None:
    kv, buffers = pool(2)
    be_slots = kv.allocate("be", 12, realtime=False)
    write(buffers, be_slots, seed=1)
    original = gather(buffers, be_slots)
    kv.allocate("rt", 2, realtime=True)  # the 4 free slots sit in the BE's second block
    taken = kv.allocate("rt", 5, realtime=True)
    assert taken is not None and len(taken) == 5
    # 2 of the 4 free slots went first, then 3 slots were taken from the BE request.
    assert kv.host_tokens("be") == 3 and kv.resident("be") == 9
    assert sum(p.slots for p in kv.preemptions) == 3 and {p.best_effort for p in kv.preemptions} == {"be"}
    write(buffers, kv.slots("rt"), seed=2)  # the RT request overwrites what it took
    check_sides(kv)
    kv.release("rt")
    restored = kv.restore("be")
    assert restored is not None and len(restored) == 3
    assert kv.host_tokens("be") == 0 and kv.preemptions == []
    for before, after in zip(original, gather(buffers, kv.slots("be"))):
        assert torch.equal(before, after)
    check_sides(kv)


def test_running_best_effort_requests_are_protected_and_drops_follow_the_given_order() -> None:
    kv, _ = pool(2)
    kv.allocate("be-running", 8, realtime=False)
    kv.allocate("rt-old", 8, realtime=True)
    assert kv.allocate("rt-new", 4, realtime=True, protect=["be-running"]) is None
    slots = kv.allocate("rt-new", 4, realtime=True, protect=["be-running"], evict_order=["be-running", "rt-old"])
    assert slots is not None
    assert kv.resident("be-running") == 8 and kv.host_tokens("rt-old") == 8
    check_sides(kv)


def test_recompute_mode_drops_the_whole_best_effort_request() -> None:
    kv, _ = pool(2, bidirectional=False)
    kv.allocate("be", 16, realtime=False)
    assert kv.allocate("rt", 3, realtime=True) is not None
    assert kv.resident("be") == 0 and kv.host_tokens("be") == 0
    assert kv.take_dropped("be") == 16 and kv.take_dropped("be") == 0
    kv.allocate("rt-2", 1, realtime=True)
    assert {slot // S for slot in kv.slots("rt-2")}.isdisjoint({slot // S for slot in kv.slots("rt")})


def test_release_frees_everything_and_bad_use_is_refused() -> None:
    kv, _ = pool(2)
    kv.allocate("a", 5, realtime=True)
    with pytest.raises(ValueError, match="already has slots as RT"):
        kv.allocate("a", 1, realtime=False)
    kv.release("a")
    kv.release("a")
    assert kv.free_slots == 16 and (kv.rt_owner == -1).all()
    with pytest.raises(ValueError, match="at least one block"):
        BidirectionalKV(0, S)
