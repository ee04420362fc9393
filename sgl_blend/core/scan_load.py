"""What a request asks of the engine over its life, and what a set of requests still needs.

The dual scanner budgets in these terms: a request's compute and KV-read time (the cost
model's, less what prefix reuse saves), the prompt tokens it prefills, the iterations it decodes,
and the KV the engine's admission counts against it -- which grows as it decodes, so a set of
running requests needs most memory at some point ahead, not now (`peak_commitment`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sgl_blend.core.cost_model import reserve_at


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """What one request asks of the engine over its life, as the scanner budgets it. Built by
    keyword: most fields are token counts or seconds, which a positional call would swap silently."""

    comp: float
    """Compute seconds, less what reusing the previous request's prefix saves."""
    mem: float
    """KV-read seconds of its decode steps."""
    prefill: int
    """Prompt tokens it computes (its prompt less the reused prefix)."""
    steps: int
    """Decode iterations it runs: its (estimated) output length."""
    commit: float
    """KV tokens the engine's admission counts against it, averaged over its life."""
    prompt: int = 0
    """Prompt tokens its decode steps read."""
    unshared_prompt: int = 0
    """Prompt tokens no other request shares: the only part of its prompt its KV counts (a shared
    prefix is the radix cache's, there once whoever uses it)."""
    max_new_tokens: int = 0
    """Its output bound, which fixes the decode room SGLang reserves for it (`reserve_at`)."""
    exact: bool = False
    """Whether it decodes exactly ``max_new_tokens`` (``ignore_eos``)."""

    def last_commitment(self) -> float:
        """What the engine counts against it at its last decode step, started now: the most it
        ever needs (see `commitment_bound`)."""
        last = max(self.steps - 1, 0)
        return self.unshared_prompt + last + float(reserve_at(last, self.max_new_tokens, self.exact))

    def left_after(self, decoded: int) -> tuple[float, float, float]:
        """(compute, memory, KV-token-iterations) it still needs after ``decoded`` tokens."""
        steps = max(self.steps, 1)
        decoded = min(decoded, steps)
        done = self.prompt * decoded + decoded * decoded / 2.0
        whole = self.prompt * steps + steps * steps / 2.0
        mem = self.mem * (1.0 - done / whole) if whole else 0.0
        comp = self.comp * (steps - decoded) / (self.prefill + steps)
        return comp, mem, self.commit * (steps - decoded)


@dataclass
class LoadTotals:
    """Sums over a set of requests' loads, kept exact under add and remove."""

    comp: float = 0.0
    mem: float = 0.0
    prefill: float = 0.0
    kv_steps: float = 0.0
    steps: float = 0.0
    count: int = 0

    def add(self, load: Load, sign: int = 1) -> None:
        self.comp += sign * load.comp
        self.mem += sign * load.mem
        self.prefill += sign * load.prefill
        self.kv_steps += sign * load.commit * max(load.steps, 1)
        self.steps += sign * max(load.steps, 1)
        self.count += sign


def _columns(tracks: Sequence[tuple[Load, int]]) -> tuple[np.ndarray, ...]:
    """Unshared prompt, tokens decoded, steps left, output bound and ``ignore_eos``, per track."""
    unshared = np.array([load.unshared_prompt for load, _decoded in tracks], dtype=float)
    decoded = np.array([decoded for _load, decoded in tracks], dtype=float)
    ends = np.maximum(np.array([load.steps for load, _decoded in tracks], dtype=float) - decoded, 0.0)
    max_new = np.array([load.max_new_tokens for load, _decoded in tracks], dtype=float)
    exact = np.array([load.exact for load, _decoded in tracks], dtype=bool)
    return unshared, decoded, ends, max_new, exact


def commitment_bound(tracks: Sequence[tuple[Load, int]]) -> float:
    """A bound on `peak_commitment` that costs one pass: each request's commitment at its last
    step, summed. A request's commitment never falls while it decodes -- each token adds one and
    releases at most one of reserve (the reserve ratio is at most 1) -- so no moment needs more."""
    if not tracks:
        return 0.0
    unshared, decoded, ends, max_new, exact = _columns(tracks)
    last = decoded + np.maximum(ends - 1.0, 0.0)
    return float(np.sum(unshared + last + reserve_at(last, max_new, exact)))


def peak_commitment(tracks: Sequence[tuple[Load, int]]) -> float:
    """The most KV the engine will count against requests ``(load, decoded so far)`` as they
    decode on to their estimated lengths: the sum rises while requests grow and drops as each
    finishes, so it peaks just before some request finishes (or now)."""
    if not tracks:
        return 0.0
    unshared, decoded, ends, max_new, exact = _columns(tracks)
    offsets = np.unique(np.concatenate([[0.0], np.maximum(ends - 1.0, 0.0)]))[:, None]
    at = decoded + offsets
    alive = (offsets < ends) | (offsets == 0)
    return float(np.max(np.sum((unshared + at + reserve_at(at, max_new, exact)) * alive, axis=1)))
