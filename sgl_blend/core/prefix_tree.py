"""The resource-aware prefix tree: a compressed trie over prompt token ids (paper §4.2).

Requests sit on the node where their prompt ends (identical prompts share a node). Every node
keeps exact aggregates of its subtree -- compute and memory time, request count, prompt tokens,
tokens saved by sharing -- updated along one root-to-node path on each insert and remove, so
densities and sharing ratios of any subtree are O(1) reads.

Memory is what limits this at 400K requests: a new leaf copies only the unmatched suffix of its
prompt into a compact ``array('i')``, splits share that array (``source``, ``start``, ``end``),
so tokens shared by many prompts are stored once; prefix comparison runs on array slices, in C,
with a binary search for the mismatch.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence


class Node:
    __slots__ = (
        "parent",
        "children",
        "source",
        "start",
        "end",
        "requests",
        "count",
        "comp",
        "mem",
        "prompt_tokens",
        "saved",
        "sample_count",
        "sample_sum",
        "first_admitted",
    )

    def __init__(self, parent: Node | None, source: array, start: int, end: int) -> None:
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.source = source
        self.start = start
        self.end = end
        self.requests: list[int] = []
        self.count = 0
        self.comp = 0.0
        self.mem = 0.0
        self.prompt_tokens = 0
        self.saved = 0
        self.sample_count = 0
        self.sample_sum = 0
        # the engine iteration in which a request through this node was first admitted (its
        # tokens computed then), or -1: a policy's runtime record, kept on the node it describes
        self.first_admitted = -1

    @property
    def edge_len(self) -> int:
        return self.end - self.start

    def prefix_len(self) -> int:
        """Tokens from the root to the end of this node's edge."""
        length = 0
        node: Node | None = self
        while node is not None:
            length += node.end - node.start
            node = node.parent
        return length


def _common_prefix(a: array, a_start: int, b: array, b_start: int, limit: int) -> int:
    """Length of the common prefix of two array windows, by slice comparison and bisection."""
    if a[a_start : a_start + limit] == b[b_start : b_start + limit]:
        return limit
    low, high = 0, limit
    while high - low > 1:
        middle = (low + high) // 2
        if a[a_start : a_start + middle] == b[b_start : b_start + middle]:
            low = middle
        else:
            high = middle
    return low


class PrefixTree:
    """Requests are dense integer ids; per-request costs are supplied by the caller at insert."""

    def __init__(self) -> None:
        self.root = Node(None, array("i"), 0, 0)
        self.node_of: dict[int, Node] = {}
        self.prompt_len: dict[int, int] = {}
        self._cost: dict[int, tuple[float, float]] = {}

    def __len__(self) -> int:
        return self.root.count

    def match(self, tokens: Sequence[int] | array) -> tuple[list[Node], int, int]:
        """Follow ``tokens`` down from the root as far as they match: the nodes entered (the root
        first), how many tokens matched, and how many of the last node's edge they cover (less
        than its ``edge_len`` when they end or differ inside it)."""
        ids = tokens if isinstance(tokens, array) else array("i", tokens)
        node, position = self.root, 0
        path = [self.root]
        while position < len(ids):
            child = node.children.get(ids[position])
            if child is None:
                break
            limit = min(child.edge_len, len(ids) - position)
            matched = _common_prefix(child.source, child.start, ids, position, limit)
            path.append(child)
            position += matched
            if matched < child.edge_len:
                return path, position, matched
            node = child
        return path, position, node.edge_len

    def insert(self, request: int, tokens: Sequence[int] | array, comp: float, mem: float) -> Node:
        ids = tokens if isinstance(tokens, array) else array("i", tokens)
        path, position, covered = self.match(ids)
        node = path[-1]
        if covered < node.edge_len:
            node = path[-1] = self._split(node, covered)
        if position < len(ids):
            parent = node
            node = Node(parent, ids[position:], 0, len(ids) - position)
            parent.children[ids[position]] = node
            path.append(node)
        node.requests.append(request)
        self.node_of[request] = node
        self.prompt_len[request] = len(ids)
        self._cost[request] = (comp, mem)
        self._apply(path, len(ids), comp, mem, +1)
        return node

    def _split(self, child: Node, at: int) -> Node:
        """Cut ``child``'s edge after ``at`` tokens; the new upper node inherits its aggregates."""
        parent = child.parent
        assert parent is not None, "only a non-empty edge is split, and the root's is empty"
        upper = Node(parent, child.source, child.start, child.start + at)
        parent.children[child.source[child.start]] = upper
        child.parent = upper
        child.start += at
        upper.children[child.source[child.start]] = child
        for field in ("count", "comp", "mem", "prompt_tokens", "sample_count", "sample_sum", "first_admitted"):
            setattr(upper, field, getattr(child, field))
        upper.saved = child.saved
        child.saved -= at * max(child.count - 1, 0)
        return upper

    def _apply(self, path: list[Node], prompt_len: int, comp: float, mem: float, sign: int) -> None:
        """Update aggregates along the root-to-node path for one request added or removed.

        A node's own contribution to ``saved`` is ``edge_len * (count - 1)``; it changes by
        ``edge_len`` whenever count changes while staying >= 1, and that change reaches every
        ancestor, hence the bottom-up running sum.
        """
        delta_saved = 0
        for node in reversed(path):
            before = node.count
            node.count += sign
            after = node.count
            delta_saved += node.edge_len * (max(after - 1, 0) - max(before - 1, 0))
            node.saved += delta_saved
            node.comp += sign * comp
            node.mem += sign * mem
            node.prompt_tokens += sign * prompt_len

    def path(self, node: Node) -> list[Node]:
        nodes = []
        current: Node | None = node
        while current is not None:
            nodes.append(current)
            current = current.parent
        nodes.reverse()
        return nodes

    def remove(self, request: int) -> None:
        node = self.node_of.pop(request)
        node.requests.remove(request)
        comp, mem = self._cost.pop(request)
        self._apply(self.path(node), self.prompt_len.pop(request), comp, mem, -1)
        while node is not self.root and node.count == 0:
            parent = node.parent
            assert parent is not None, "every node but the root has a parent"
            del parent.children[node.source[node.start]]
            node = parent

    def unshared_tokens(self, request: int) -> int:
        """Prompt tokens of this request that no other request in the tree shares."""
        node = self.node_of[request]
        return node.edge_len if node.count == 1 else 0

    def update_cost(self, request: int, comp: float, mem: float) -> None:
        """Re-cost a request in place (its output-length estimate changed)."""
        old_comp, old_mem = self._cost[request]
        self._cost[request] = (comp, mem)
        for node in self.path(self.node_of[request]):
            node.comp += comp - old_comp
            node.mem += mem - old_mem

    def cost(self, request: int) -> tuple[float, float]:
        return self._cost[request]

    def sharing_ratio(self, node: Node | None = None) -> float:
        """Tokens saved by sharing over prompt tokens, for the subtree under ``node``."""
        node = node or self.root
        return node.saved / node.prompt_tokens if node.prompt_tokens else 0.0

    def dfs_order(self, node: Node | None = None) -> list[int]:
        """Requests in depth-first order: each node's requests, then its children in insertion order."""
        return [request for current in self.iter_nodes(node) for request in current.requests]

    def iter_nodes(self, node: Node | None = None) -> Iterator[Node]:
        """Pre-order traversal, iterative (prompts are deep; recursion would overflow)."""
        stack = [node or self.root]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(reversed(list(current.children.values())))

    def tokens(self, request: int) -> array:
        """A request's prompt, reassembled from the edges on its path."""
        tokens = array("i")
        for node in self.path(self.node_of[request]):
            tokens.extend(node.source[node.start : node.end])
        return tokens


def order_sharing_ratio(prompts: Sequence[Sequence[int]]) -> float:
    """Sharing ratio of an execution order: each prompt reuses its common prefix with the one
    before it (a cache that holds exactly the previous request), over all prompt tokens."""
    total = sum(len(prompt) for prompt in prompts)
    if not total:
        return 0.0
    saved = 0
    previous: array = array("i")
    for prompt in prompts:
        current = prompt if isinstance(prompt, array) else array("i", prompt)
        saved += _common_prefix(previous, 0, current, 0, min(len(previous), len(current)))
        previous = current
    return saved / total
