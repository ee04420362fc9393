"""Planning a whole batch before any of it reaches the engine (paper §4 over every request).

The engine's scheduler holds only what has been sent to it, a small multiple of its running
batch; BlendServe's tree, its density order and the cut between the compute and the memory side
are properties of the whole request set. So the batch is planned here, once over every
unfinished line (and again after the output-length samples return), and the engine is fed from
both ends of that plan: each request travels with its `Placement`, and the scheduler admits by
it. Feeding interleaves the two sides at the rates the dual scan admits them (each side's memory
share over the KV-token-iterations of its mean request, Alg. 3 steps 1-2), so the scheduler
always holds the fronts of both sides in the proportion it will take them.

Where blending cannot pay (`blend=False`: the device's measured overlap hides nothing), the plan
is the tree's DFS order with one cursor and no samples: the best an order can do for sharing.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sgl_blend.core.cost_model import CostModel, SharingPrice, memory_partition, shared_density
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.output_length import DEFAULT_SAMPLE_RATE, OutputLengthEstimator
from sgl_blend.core.placement import COMPUTE, MEMORY, SAMPLE, Placement
from sgl_blend.core.planner import Plan, TreePlanner
from sgl_blend.core.prefix_tree import PrefixTree

NEVER = 1e300  # the admission gap of a side with no memory share: fed after everything else

K = TypeVar("K", bound=Hashable)  # the caller's key for a request (`WorkItem.key`)


@dataclass
class BatchPlan(Generic[K]):
    """``feed``: every key in the order to send it (samples first); ``placements``: each key's
    place; ``memory_share``: the fraction of KV the memory side is planned to hold; ``order``: the
    planner's account of its sort and split (None where the plan does not blend)."""

    feed: list[K]
    placements: dict[K, Placement]
    samples: list[K] = field(default_factory=list)
    memory_share: float = 0.0
    order: Plan | None = None

    @property
    def blended(self) -> bool:
        return any(placement.side == MEMORY for placement in self.placements.values())


def plan_batch(
    items: Sequence[WorkItem[K]],
    cost_model: CostModel,
    *,
    blend: bool,
    one_cursor: bool = False,
    sample_rate: float = DEFAULT_SAMPLE_RATE,
    observed: Mapping[K, tuple[WorkItem, int]] | None = None,
    seed: int = 0,
) -> BatchPlan[K]:
    """Plan ``items``. ``observed``: samples that already ran (key -> (item, output length)),
    whose lengths refine the estimates; when given, nothing is sampled again. ``one_cursor`` keeps
    the order and puts every line on the compute side: one cursor walks it from its compute-heavy
    end, and lines are fed in that order."""
    tree = PrefixTree()
    rate = sample_rate if blend and observed is None else 0.0
    estimator = OutputLengthEstimator(tree, rate, seed)
    keys = [item.key for item in items]
    samples = []
    for index, item in enumerate(items):
        if estimator.register(index, item.max_new_tokens, item.exact_output_len):
            samples.append(index)
        _insert(tree, cost_model, index, item, estimator.estimate(index))
    for offset, (item, output_len) in enumerate((observed or {}).values()):
        index = len(items) + offset
        _insert(tree, cost_model, index, item, output_len)
        estimator.add_observed_sample(index, item.max_new_tokens, output_len)
    for index, item in enumerate(items):
        _insert(tree, cost_model, index, item, estimator.estimate(index), update=True)
    sampled = set(samples)

    def include(index: int) -> bool:
        return index < len(items) and index not in sampled

    price = cost_model.sharing_price()
    plan = TreePlanner(tree, price, include).plan() if blend else None
    if plan is not None:
        order, boundary, reuse = plan.order, plan.boundary, plan.reuse
    else:
        order = [index for index in tree.dfs_order() if include(index)]
        boundary, reuse = len(order), {}
    if one_cursor:
        boundary = len(order)
    placements: dict[K, Placement] = {}
    for position, index in enumerate(samples):
        placements[keys[index]] = _placement(tree, estimator, price, index, 0, SAMPLE, position, None)
    for rank, index in enumerate(order):
        # the compute side is scanned from its start, the memory side from its end
        side, after = (COMPUTE, boundary - 1 - rank) if rank < boundary else (MEMORY, rank - boundary)
        placements[keys[index]] = _placement(
            tree, estimator, price, index, reuse.get(index, 0), side, len(samples) + rank, after
        )
    left, right = order[:boundary], order[boundary:]
    share = _memory_share(tree, price, reuse, left, right)
    feed = [keys[index] for index in samples + _interleave(tree, cost_model, estimator, left, right[::-1], share)]
    return BatchPlan(feed, placements, [keys[index] for index in samples], share, plan)


def _insert(
    tree: PrefixTree, cost_model: CostModel, index: int, item: WorkItem, output: int, update: bool = False
) -> None:
    prompt = len(item.prompt_ids)
    comp, mem = cost_model.comp_time(prompt, output), cost_model.mem_time(prompt, output)
    if update:
        tree.update_cost(index, comp, mem)
    else:
        tree.insert(index, item.prompt_ids, comp, mem)


def _placement(
    tree: PrefixTree,
    estimator: OutputLengthEstimator,
    price: SharingPrice,
    index: int,
    reuse: int,
    side: str,
    position: int,
    after: int | None,
) -> Placement:
    """The request's place; its density counts the prefix it reuses from the request before it."""
    comp, mem = tree.cost(index)
    return Placement(
        side, position, shared_density(comp, mem, price.prefix_saving(reuse)), estimator.estimate(index), after
    )


def _memory_share(
    tree: PrefixTree, price: SharingPrice, reuse: Mapping[int, int], left: list[int], right: list[int]
) -> float:
    """``M_R / M`` (Alg. 3, step 1) for the two sides (each in plan order), with each side's
    compute less what its requests save by reusing their neighbour's prefix within the side: a
    side is scanned as one DFS run, so its first request shares nothing with the other side."""
    if not left or not right:
        return 1.0 if right else 0.0
    densities = []
    for side in (left, right):
        comp = sum(tree.cost(index)[0] for index in side)
        mem = sum(tree.cost(index)[1] for index in side)
        saved = sum(price.prefix_saving(reuse.get(index, 0)) for index in side[1:])
        densities.append((comp, mem, saved))
    (comp_left, mem_left, saved_left), (comp_right, mem_right, saved_right) = densities
    if mem_left <= 0 or mem_right <= 0:
        return 0.0 if mem_right <= 0 else 1.0
    rho_root = shared_density(comp_left + comp_right, mem_left + mem_right, saved_left + saved_right)
    _share_left, share_right = memory_partition(
        1.0,
        rho_root,
        shared_density(comp_left, mem_left, saved_left),
        shared_density(comp_right, mem_right, saved_right),
    )
    return share_right


def _interleave(
    tree: PrefixTree,
    cost_model: CostModel,
    estimator: OutputLengthEstimator,
    left: list[int],
    right: list[int],
    memory_share: float,
) -> list[int]:
    """Both sides merged by when the dual scan would admit each request: a side with share ``M``
    admits ``M / (footprint x lifetime)`` of its mean request per iteration (Alg. 3, step 2)."""
    if not left or not right:
        return left or right

    def gap(side: list[int], share: float) -> float:
        occupancy = sum(
            cost_model.kv_footprint(tree.prompt_len[index], estimator.estimate(index))
            * max(estimator.estimate(index), 1)
            for index in side
        ) / len(side)
        return occupancy / share if share > 0 else NEVER

    gaps = (gap(left, 1.0 - memory_share), gap(right, memory_share))
    return [
        index
        for _time, _side, _rank, index in heapq.merge(
            ((rank * gaps[0], 0, rank, index) for rank, index in enumerate(left)),
            ((rank * gaps[1], 1, rank, index) for rank, index in enumerate(right)),
        )
    ]
