"""Layer-wise sort, conditional node split and merge (paper §4.2, Algorithms 1-2).

Sorting every node's children by compute density, highest first, turns a DFS of the tree into
an order that runs from compute-heavy to memory-heavy while keeping each shared prefix
contiguous. Sorting alone cannot move an outlier out of its subtree: a memory-heavy request that
happens to share a prefix with compute-heavy ones stays among them. A split detaches such a
subtree and lets it be sorted at the root, at the price of recomputing its shared prefix once.
Splits are taken greedily while the recomputation stays within ``t`` of the tree's savings
(default 1%, keeping at least 99% of the sharing ratio), each node at most once, repeating
sort -> split until no affordable outlier is left. The merge step (paper A.2) then treats every
subtree whose requests all lie on one side of the root's density as a single node: the order is
cut into a compute side and a memory side only between such units, so no shared prefix is
scanned from both ends, and a unit is not sorted inside, so a side's scan does not run through
look-alike requests whose outputs would grow and finish in lockstep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from sgl_blend.core.prefix_tree import Node, PrefixTree

DEFAULT_SPLIT_THRESHOLD = 0.01
MAX_SPLIT_ROUNDS = 8


@dataclass
class Plan:
    """A scan order over request ids, and the cut between compute side and memory side.

    ``reuse`` maps a request to the prompt tokens it shares with the request before it in the
    order: in a DFS of the tree that is all the prefix it finds cached, so its prefill computes
    only the rest. Orders that are not a DFS of the tree leave it empty.
    """

    order: list[int]
    boundary: int
    root_density: float
    splits: int
    sharing_kept: float
    reuse: dict[int, int] = field(default_factory=dict)


@dataclass
class _Aggregate:
    comp: float = 0.0
    mem: float = 0.0
    count: int = 0
    min_density: float = float("inf")
    max_density: float = 0.0

    def density(self) -> float:
        return self.comp / self.mem if self.mem > 0 else float("inf")


class Planner:
    """Plans the requests of one tree that ``include`` accepts (the pending ones)."""

    def __init__(self, tree: PrefixTree, include: Callable[[int], bool] = lambda _request: True,
                 split_threshold: float = DEFAULT_SPLIT_THRESHOLD) -> None:
        self.tree = tree
        self.include = include
        self.split_threshold = split_threshold
        self.detached: set[int] = set()
        self._aggregates: dict[int, _Aggregate] = {}

    def plan(self) -> Plan:
        budget = self.split_threshold * self.tree.root.saved
        spent = 0
        for _round in range(MAX_SPLIT_ROUNDS):
            self._aggregate()
            root_density = self._aggregates[id(self.tree.root)].density()
            candidates = self._outliers(root_density)
            taken = 0
            for cost, node in candidates:
                if spent + cost > budget:
                    continue
                self.detached.add(id(node))
                spent += cost
                taken += 1
            if not taken:
                break
        self._aggregate()
        root = self._aggregates[id(self.tree.root)]
        order, cuts, reuse = self._sorted_order()
        boundary = self._boundary(order, cuts, root.density())
        saved = self.tree.root.saved
        return Plan(order, boundary, root.density(), len(self.detached),
                    (saved - spent) / saved if saved else 1.0, reuse)

    def _request_density(self, request: int) -> float:
        comp, mem = self.tree.cost(request)
        return comp / mem if mem > 0 else float("inf")

    def _aggregate(self) -> None:
        """Bottom-up aggregates of included requests, with detached subtrees counted at the root
        instead of under their old ancestors."""
        aggregates: dict[int, _Aggregate] = {}
        nodes = list(self.tree.iter_nodes())
        for node in reversed(nodes):
            total = _Aggregate()
            for request in node.requests:
                if self.include(request):
                    comp, mem = self.tree.cost(request)
                    density = comp / mem if mem > 0 else float("inf")
                    total.comp += comp
                    total.mem += mem
                    total.count += 1
                    total.min_density = min(total.min_density, density)
                    total.max_density = max(total.max_density, density)
            for child in node.children.values():
                if id(child) in self.detached:
                    continue
                _merge(total, aggregates[id(child)])
            aggregates[id(node)] = total
        root = aggregates[id(self.tree.root)]
        for node in nodes:
            if id(node) in self.detached:
                _merge(root, aggregates[id(node)])
        self._aggregates = aggregates

    def _outliers(self, root_density: float) -> list[tuple[int, Node]]:
        """Subtrees on the other side of the root's density from their parent's subtree, cheapest
        recomputation per unit of work first."""
        found = []
        for node in self.tree.iter_nodes():
            parent = node.parent
            if parent is None or parent is self.tree.root or id(node) in self.detached:
                continue
            mine, theirs = self._aggregates[id(node)], self._aggregates[id(parent)]
            if not mine.count or not theirs.count:
                continue
            if (mine.density() - root_density) * (theirs.density() - root_density) < 0:
                cost = parent.prefix_len()
                found.append((cost / (mine.comp + mine.mem + 1e-30), cost, node))
        found.sort(key=lambda item: item[0])
        return [(cost, node) for _ratio, cost, node in found]

    def _sorted_order(self) -> tuple[list[int], list[int], dict[int, int]]:
        """DFS with children by density, highest first; detached subtrees sorted among the root's
        children. A subtree whose requests all lie on one side of the root's density is merged
        into a unit: the order is never cut inside it, and it is not sorted inside either -- its
        requests keep the tree's insertion order, so a side does not take a run of look-alike
        requests (outputs of one length would start, grow and finish together). Also returns
        where the order may be cut, and each request's reuse: the prefix length of the highest
        node entered since the request before it, which is their common ancestor (a detached
        subtree re-enters from the root)."""
        root = self.tree.root
        root_density = self._aggregates[id(root)].density()
        top = [child for child in root.children.values() if id(child) not in self.detached]
        top += [node for node in self.tree.iter_nodes() if id(node) in self.detached]
        top = [node for node in top if self._aggregates[id(node)].count]
        top.sort(key=lambda node: self._aggregates[id(node)].density(), reverse=True)
        order = [request for request in root.requests if self.include(request)]
        cuts = list(range(len(order)))
        reuse = dict.fromkeys(order, 0)
        shared = 0
        stack: list[tuple[Node, bool, int, int]] = [(node, False, 0, node.prefix_len() - node.edge_len)
                                                    for node in reversed(top)]
        while stack:
            node, in_unit, entry, depth = stack.pop()
            depth += node.edge_len
            shared = min(shared, entry)
            aggregate = self._aggregates[id(node)]
            one_sided = aggregate.min_density >= root_density or aggregate.max_density < root_density
            if not in_unit:
                cuts.append(len(order))
            in_unit = in_unit or one_sided
            for request in node.requests:
                if self.include(request):
                    if not in_unit:
                        cuts.append(len(order))
                    order.append(request)
                    reuse[request] = shared
                    shared = depth
            children = [child for child in node.children.values()
                        if id(child) not in self.detached and self._aggregates[id(child)].count]
            if not in_unit:
                children.sort(key=lambda child: self._aggregates[id(child)].density())
            else:
                children.reverse()
            stack.extend((child, in_unit, depth, depth) for child in children)
        return order, cuts, reuse

    def _boundary(self, order: list[int], cuts: list[int], root_density: float) -> int:
        """The allowed cut closest to where request density first drops below the root's."""
        crossing = next((index for index, request in enumerate(order)
                         if self._request_density(request) < root_density), len(order))
        return min(cuts + [len(order)], key=lambda cut: abs(cut - crossing))


def _merge(total: _Aggregate, part: _Aggregate) -> None:
    total.comp += part.comp
    total.mem += part.mem
    total.count += part.count
    total.min_density = min(total.min_density, part.min_density)
    total.max_density = max(total.max_density, part.max_density)
