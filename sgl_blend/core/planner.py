"""Layer-wise sort, conditional node split and merge (paper §5.2, Appendix A.1 Algorithms 1-2).

Sorting every node's children by compute density, highest first, turns a DFS of the tree into
an order that runs from compute-heavy to memory-heavy while keeping each shared prefix
contiguous. Sorting alone cannot move an outlier out of its subtree: a memory-heavy request that
happens to share a prefix with compute-heavy ones stays among them. A split detaches such a
subtree and sorts it among the root's children, at the price of recomputing the prefix it shared.

Densities count sharing (the paper's ``rho(R) = (1 - s) T_comp / T_mem``): a subtree's compute is
less what its shared prompt tokens save when its requests run together, entered from the root --
every distinct prompt token of the subtree's paths computed once (`SharingPrice`: exactly the
prefill those tokens do not recompute, linear layers and their own attention rows). A single
request's density (its leaf density) counts the prefix it shares with any other planned request.

The split follows Algorithm 2 and §5.4. The budget ``t`` (default 1% of the planned requests'
shared tokens, keeping at least 99% of the sharing ratio) is divided among a node's children as
the recursion descends, so each subtree has its own share of it; detaching a subtree costs the
prefix it shared with its parent (recomputed once more), and is affordable only while that
subtree and each of its ancestors stay within their shares. The loop runs to convergence: sort,
then find the leaves outside a longest non-increasing run of leaf densities in the sorted order
(the fewest leaves whose removal leaves it non-increasing), detach for each the largest subtree
made only of such leaves, within budget, and sort again -- until the leaf order is non-increasing
(C1) or no such subtree is affordable (C2). Each node is detached at most once, so it ends.

The merge step (paper A.2) then treats every subtree whose requests all lie on one side of the
root's density as a single unit: the order is cut into a compute side and a memory side only
between units, so no shared prefix is scanned from both ends, and a unit is not sorted inside, so
a side's scan does not run through look-alike requests whose outputs grow and finish in lockstep.
"""

from __future__ import annotations

import bisect
import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sgl_blend.core.cost_model import SharingPrice
from sgl_blend.core.prefix_tree import PrefixTree

DEFAULT_SPLIT_THRESHOLD = 0.01
ROOT = 0


@dataclass
class Plan:
    """A scan order over request ids, and the cut between compute side and memory side.

    ``reuse`` maps a request to the prompt tokens it shares with the request before it in the
    order: in a DFS of the tree that is all the prefix it finds cached, so its prefill computes
    only the rest. Orders that are not a DFS of the tree leave it empty. ``rounds`` counts the
    sort -> split passes the planner took to converge, and ``monotone`` says how it stopped: the
    sorted leaf order non-increasing in density (C1), or no outlier left that the budget affords
    to move (C2).
    """

    order: list[int]
    boundary: int
    root_density: float
    splits: int
    sharing_kept: float
    reuse: dict[int, int] = field(default_factory=dict)
    rounds: int = 0
    monotone: bool = False


class TreePlanner:
    """Plans the requests of one tree that ``include`` accepts (the pending ones); ``price`` is
    what a shared prompt token saves on the device the tree's costs are for.

    The tree is read once into flat arrays (nodes in pre-order); a round's aggregates are numpy
    sums level by level up the tree, so a sort -> split round over 400K requests stays a second
    or two and the loop can run to convergence."""

    def __init__(
        self,
        tree: PrefixTree,
        price: SharingPrice,
        include: Callable[[int], bool] = lambda _request: True,
        split_threshold: float = DEFAULT_SPLIT_THRESHOLD,
    ) -> None:
        self.tree = tree
        self.price = price
        self.include = include
        self.split_threshold = split_threshold

    def plan(self) -> Plan:
        """Sort, split to convergence, merge, cut. The garbage collector is paused meanwhile: the
        plan allocates millions of small containers and no cycles, and each collection it would
        trigger scans the whole tree."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._plan()
        finally:
            if collecting:
                gc.enable()

    def _plan(self) -> Plan:
        self._index()
        if not self._node_of:
            return Plan([], 0, 0.0, 0, 1.0, monotone=True)
        self._aggregate()
        saved = float(self._ptok[ROOT] - self._utok[ROOT])
        self._budget = self._budgets(self.split_threshold * saved)
        self._spent = [0.0] * self._size
        rounds = 1
        while True:
            sequence = self._leaf_sequence()
            outliers = _outside_longest_non_increasing([self._leaf[request] for request in sequence])
            if not self._split(sequence, outliers):
                break
            self._aggregate()
            rounds += 1
        order, cuts, reuse = self._sorted_order()
        root_density = float(self._density[ROOT])
        boundary = self._boundary(order, cuts, root_density)
        kept = (saved - self._spent[ROOT]) / saved if saved else 1.0
        return Plan(order, boundary, root_density, len(self._detached), kept, reuse, rounds, not outliers)

    # -- the tree as flat arrays, once per plan ----------------------------------------------------

    def _index(self) -> None:
        """Nodes in pre-order with their parent, depth (tokens and levels) and children; each
        node's included requests and their sums; every request's leaf density."""
        tree, price = self.tree, self.price
        nodes = list(tree.iter_nodes())
        position = {id(node): index for index, node in enumerate(nodes)}
        size = self._size = len(nodes)
        parent, depth, level = [ROOT] * size, [0] * size, [0] * size
        children: list[list[int]] = [[] for _ in range(size)]
        own: list[list[int]] = [[] for _ in range(size)]
        node_of: dict[int, int] = {}
        own_comp, own_mem = [0.0] * size, [0.0] * size
        for index, node in enumerate(nodes):
            if index:
                up = position[id(node.parent)]
                parent[index], depth[index], level[index] = up, depth[up] + node.edge_len, level[up] + 1
                children[up].append(index)
            mine = own[index] = [request for request in node.requests if self.include(request)]
            for request in mine:
                node_of[request] = index
                comp, mem = tree.cost(request)
                own_comp[index] += comp
                own_mem[index] += mem
        own_count = np.array([len(requests) for requests in own], dtype=float)
        prompt = np.array(depth, dtype=float)
        # count, comp, mem, prompt tokens and prompt pairs of each node's own requests (all of
        # them end at the node, so their prompts are its depth)
        sums = np.array([own_count, own_comp, own_mem, own_count * prompt, own_count * prompt**2 / 2.0])
        self._parent, self._children, self._own, self._node_of = np.array(parent), children, own, node_of
        self._depth = depth
        self._entry = prompt[self._parent] * (np.arange(size) != ROOT)
        self._edge_tok = prompt - self._entry
        self._edge_pairs = (prompt**2 - self._entry**2) / 2.0
        levels = np.array(level)
        by_level = np.argsort(levels, kind="stable")
        self._levels = [
            group
            for group in np.split(by_level, np.flatnonzero(np.diff(levels[by_level])) + 1)
            if group.size and levels[group[0]] > 0
        ]
        self._own_sums = sums
        self._detached: list[int] = []
        self._is_detached = np.zeros(size, dtype=bool)
        count = sums[0].copy()
        self._lift(count)
        self._leaf: dict[int, float] = {}
        low, high = np.full(size, np.inf), np.zeros(size)
        shared = [0] * size
        for index in range(size):
            shared[index] = depth[index] if count[index] >= 2 else (shared[parent[index]] if index else 0)
            for request in own[index]:
                comp, mem = tree.cost(request)
                density = max(comp - price.prefix_saving(shared[index]), 0.0) / mem if mem > 0 else float("inf")
                self._leaf[request] = density
                low[index], high[index] = min(low[index], density), max(high[index], density)
        self._own_low, self._own_high = low, high

    def _lift(self, *sums: np.ndarray, finish: Callable[[np.ndarray], None] | None = None) -> None:
        """Add each node's ``sums`` into its parent's, deepest level first, so every node ends
        holding its subtree's; a detached node's stay with it. ``finish`` runs on a level's nodes
        once their sums are complete, before they are added up."""
        parent, attached = self._parent, ~self._is_detached
        for nodes in reversed(self._levels):
            if finish is not None:
                finish(nodes)
            moving = nodes[attached[nodes]]
            up = parent[moving]
            for values in sums:
                np.add.at(values, up, values[moving])

    def _budgets(self, total: float) -> list[float]:
        """Algorithm 2's per-subtree threshold: the root gets ``total``, and a node's share is
        divided evenly among its children that hold planned requests."""
        count = self._count
        budget = [0.0] * self._size
        budget[ROOT] = total
        for index in range(self._size):
            planned = [child for child in self._children[index] if count[child]]
            for child in planned:
                budget[child] = budget[index] / len(planned)
        return budget

    # -- aggregates and densities ----------------------------------------------------------------

    def _aggregate(self) -> None:
        """Subtree sums of included requests, with detached subtrees counted at the root: count,
        compute, memory, prompt tokens and their causal pairs, the distinct tokens (and pairs) of
        the subtree's own edges, and the range of its leaf densities; then every node's density
        as a unit entered from the root, and its planned children by density."""
        count, comp, mem, ptok, ppairs = (row.copy() for row in self._own_sums)
        utok, upairs = np.zeros(self._size), np.zeros(self._size)
        low, high = self._own_low.copy(), self._own_high.copy()
        parent, attached = self._parent, ~self._is_detached

        def own_edges(nodes: np.ndarray) -> None:
            planned = count[nodes] > 0
            utok[nodes] += np.where(planned, self._edge_tok[nodes], 0.0)
            upairs[nodes] += np.where(planned, self._edge_pairs[nodes], 0.0)
            moving = nodes[attached[nodes]]
            np.minimum.at(low, parent[moving], low[moving])
            np.maximum.at(high, parent[moving], high[moving])

        self._lift(count, comp, mem, ptok, ppairs, utok, upairs, finish=own_edges)
        if self._detached:
            # a detached subtree re-enters from the root: the path above it is computed again
            units = np.array(self._detached)
            entry = self._entry[units]
            for values, extra in (
                (count, 0.0),
                (comp, 0.0),
                (mem, 0.0),
                (ptok, 0.0),
                (ppairs, 0.0),
                (utok, entry),
                (upairs, entry**2 / 2.0),
            ):
                values[ROOT] += float(np.sum(values[units] + extra))
            low[ROOT], high[ROOT] = min(low[ROOT], low[units].min()), max(high[ROOT], high[units].max())
        saved = self.price.saving(ptok - utok - self._entry, ppairs - upairs - self._entry**2 / 2.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            density = np.where(mem > 0, np.maximum(comp - saved, 0.0) / mem, np.inf)
        density[count == 0] = 0.0
        self._count, self._ptok, self._utok, self._low, self._high = count, ptok, utok, low, high
        self._density = density.tolist()
        planned = np.flatnonzero((count > 0) & attached)
        planned = planned[planned != ROOT]
        ranked = planned[np.lexsort((density[planned], parent[planned]))]
        parents = parent[ranked]
        everyone = np.arange(self._size)
        self._ranked = ranked.tolist()
        self._kid_start = np.searchsorted(parents, everyone, "left").tolist()
        self._kid_end = np.searchsorted(parents, everyone, "right").tolist()

    def _kids(self, index: int) -> list[int]:
        """A node's planned children by density, lowest first (a stack pops the highest first)."""
        return self._ranked[self._kid_start[index] : self._kid_end[index]]

    # -- the sorted order and the split ----------------------------------------------------------

    def _unit_roots(self) -> list[int]:
        """The root's children and the detached subtrees, by density, lowest first: what the
        root sorts."""
        roots = self._kids(ROOT) + [unit for unit in self._detached if self._count[unit]]
        return sorted(roots, key=self._density.__getitem__)

    def _leaf_sequence(self) -> list[int]:
        """Requests in the DFS of the fully sorted tree (children by density, highest first; a
        node's own requests, which share its whole prompt and move only with it, first, by their
        leaf densities)."""
        leaf = self._leaf.__getitem__
        sequence = sorted(self._own[ROOT], key=leaf, reverse=True)
        stack = self._unit_roots()
        while stack:
            index = stack.pop()
            own = self._own[index]
            sequence.extend(sorted(own, key=leaf, reverse=True) if len(own) > 1 else own)
            stack.extend(self._kids(index))
        return sequence

    def _split(self, sequence: list[int], outliers: list[int]) -> bool:
        """Detach, for the leaves at ``outliers`` (positions in ``sequence``, the leaf sequence),
        each largest subtree made only of outliers that is not already a unit at the root, if it
        and every ancestor stay within their budget; returns whether anything was detached."""
        if not outliers:
            return False
        odd = np.zeros(self._size)
        np.add.at(odd, [self._node_of[sequence[position]] for position in outliers], 1.0)
        self._lift(odd)
        whole = (odd == self._count) & (odd > 0)
        candidates = []
        stack = [(unit, True) for unit in self._unit_roots()]
        while stack:
            index, unit_root = stack.pop()
            if not unit_root and whole[index]:
                candidates.append(index)
            elif odd[index]:
                stack.extend((child, False) for child in self._kids(index))
        moved = False
        for index in candidates:
            cost = float(self._entry[index])
            path = [index]
            while path[-1] != ROOT:
                path.append(int(self._parent[path[-1]]))
            if all(self._spent[node] + cost <= self._budget[node] for node in path):
                for node in path:
                    self._spent[node] += cost
                self._detached.append(index)
                self._is_detached[index] = True
                moved = True
        return moved

    def _sorted_order(self) -> tuple[list[int], list[int], dict[int, int]]:
        """DFS with children by density, highest first; detached subtrees sorted among the root's
        children. A subtree whose requests all lie on one side of the root's density is merged
        into a unit: the order is never cut inside it, and it is not sorted inside either -- its
        requests keep the tree's insertion order, so a side does not take a run of look-alike
        requests (outputs of one length would start, grow and finish together). Also returns
        where the order may be cut, and each request's reuse: the prefix length of the highest
        node entered since the request before it, which is their common ancestor (a detached
        subtree re-enters from the root)."""
        depth, root_density, leaf = self._depth, self._density[ROOT], self._leaf.__getitem__
        order = sorted(self._own[ROOT], key=leaf, reverse=True)
        cuts = list(range(len(order)))
        reuse = dict.fromkeys(order, 0)
        shared = 0
        stack: list[tuple[int, bool, int]] = [(unit, False, 0) for unit in self._unit_roots()]
        while stack:
            index, in_unit, entry = stack.pop()
            shared = min(shared, entry)
            one_sided = self._low[index] >= root_density or self._high[index] < root_density
            if not in_unit:
                cuts.append(len(order))
            in_unit = in_unit or one_sided
            own = self._own[index] if in_unit else sorted(self._own[index], key=leaf, reverse=True)
            for request in own:
                if not in_unit:
                    cuts.append(len(order))
                order.append(request)
                reuse[request] = shared
                shared = depth[index]
            if in_unit:
                children = [
                    child
                    for child in reversed(self._children[index])
                    if self._count[child] and not self._is_detached[child]
                ]
            else:
                children = self._kids(index)
            stack.extend((child, in_unit, depth[index]) for child in children)
        return order, cuts, reuse

    def _boundary(self, order: list[int], cuts: list[int], root_density: float) -> int:
        """The allowed cut closest to where the leaf density first drops below the root's."""
        crossing = next(
            (index for index, request in enumerate(order) if self._leaf[request] < root_density), len(order)
        )
        return min(cuts + [len(order)], key=lambda cut: abs(cut - crossing))


def _outside_longest_non_increasing(values: Sequence[float]) -> list[int]:
    """Positions not in one longest non-increasing subsequence of ``values``: the fewest that
    must move for the rest to be non-increasing (patience sorting, O(n log n))."""
    tails: list[float] = []  # tails[k]: the largest last value (negated) of a run of length k + 1
    tail_at: list[int] = []
    previous = [-1] * len(values)
    for position, value in enumerate(values):
        key = -value
        length = bisect.bisect_right(tails, key)
        if length == len(tails):
            tails.append(key)
            tail_at.append(position)
        else:
            tails[length] = key
            tail_at[length] = position
        previous[position] = tail_at[length - 1] if length else -1
    kept = set()
    position = tail_at[-1] if tail_at else -1
    while position >= 0:
        kept.add(position)
        position = previous[position]
    return [position for position in range(len(values)) if position not in kept]
