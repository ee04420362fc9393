"""Output-length estimation by sampling (paper §4.3).

A request that fixes its output length (``ignore_eos`` with ``max_new_tokens``) is exact. Of the
others, a seeded fraction p is sampled: those run first, and their observed lengths stand in for
their neighbours in the prefix tree -- requests that share a prefix tend to share an output
shape (the same few-shot template asks for the same kind of answer). An unsampled request takes
the mean of the sampled requests in its own subtree, else in its parent's (its siblings), and so
on up to the root; with no sample anywhere it takes a fallback.
"""

from __future__ import annotations

import random

from sgl_blend.core.prefix_tree import PrefixTree

DEFAULT_SAMPLE_RATE = 0.01
DEFAULT_FALLBACK = 128


class OutputLengthEstimator:
    def __init__(
        self,
        tree: PrefixTree,
        sample_rate: float = DEFAULT_SAMPLE_RATE,
        seed: int = 0,
        fallback: int = DEFAULT_FALLBACK,
    ) -> None:
        self.tree = tree
        self.sample_rate = sample_rate
        self.fallback = fallback
        self._rng = random.Random(seed)
        self._limit: dict[int, int] = {}
        self._exact: set[int] = set()
        self._observed: dict[int, int] = {}
        self._planned: dict[int, int] = {}
        self.sampled: set[int] = set()
        self._unobserved_samples = 0

    def register(self, request: int, max_new_tokens: int, exact: bool, planned: int | None = None) -> bool:
        """Record a request's bound; returns whether it was chosen as a sample. ``planned`` is
        the length a global plan already estimated for it: it stands until the real one is known,
        and the request is never sampled here (the plan sampled its batch)."""
        self._limit[request] = max_new_tokens
        if exact:
            self._exact.add(request)
            return False
        if planned is not None:
            self._planned[request] = planned
            return False
        if self._rng.random() < self.sample_rate:
            self.sampled.add(request)
            self._unobserved_samples += 1
            return True
        return False

    def add_observed_sample(self, request: int, max_new_tokens: int, output_len: int) -> None:
        """A sample that already ran (in an earlier phase of the same plan): it informs its
        neighbours' estimates like any other observed sample."""
        self.register(request, max_new_tokens, exact=False)
        if request not in self.sampled:
            self.sampled.add(request)
            self._unobserved_samples += 1
        self.observe(request, output_len)

    def forget(self, request: int) -> None:
        """Drop a request's bookkeeping; its sample, if observed, stays in the tree's aggregates
        only while the request stays in the tree."""
        if request in self.sampled and request not in self._observed:
            self._unobserved_samples -= 1
        self._limit.pop(request, None)
        self._exact.discard(request)
        self.sampled.discard(request)
        self._observed.pop(request, None)
        self._planned.pop(request, None)

    def observe(self, request: int, output_len: int) -> None:
        """Feed back a finished request's real length; a sample's updates its subtree means."""
        if request in self._observed or request not in self._limit:
            return
        self._observed[request] = output_len
        if request in self.sampled:
            self._unobserved_samples -= 1
        if request in self.sampled and request in self.tree.node_of:
            for node in self.tree.path(self.tree.node_of[request]):
                node.sample_count += 1
                node.sample_sum += output_len

    def pending_samples(self) -> int:
        """Samples whose length has not been observed yet (O(1): the planner asks every step)."""
        return self._unobserved_samples

    def estimate(self, request: int) -> int:
        limit = self._limit[request]
        if request in self._exact:
            return limit
        if request in self._observed:
            return self._observed[request]
        if request in self._planned:
            return self._planned[request]
        node = self.tree.node_of.get(request)
        while node is not None:
            if node.sample_count:
                return max(1, min(limit, round(node.sample_sum / node.sample_count)))
            node = node.parent
        return max(1, min(limit, self.fallback))
