"""A request as BROS schedules it, and what its next step adds to a batch.

A step is one forward pass for the request: a chunk of the prompt's prefill (the whole rest of
it unless the plan sets ``chunk``; only the step that ends the prompt yields a token), the
recomputation of prompt and output after its KV was dropped, or one decode token. Checkpointed
tokens that sit in host memory must be swapped back before the step (``host_tokens``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sgl_blend.core.latency_model import BatchShape


@dataclass(frozen=True)
class SLO:
    """Token deadlines of real-time requests (BROS §VII: TTFT 0.4 s, TPOT 0.2 s).

    ``idle_s`` caps an iteration no RT deadline bounds. The paper leaves it unbounded (the
    default), but an RT request that arrives meanwhile waits for the whole iteration under way
    before its prefill can start: at a tight TTFT SLO that wait, not the packing, decides P99.
    """

    ttft_s: float = 0.4
    tpot_s: float = 0.2
    idle_s: float = math.inf

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0 and self.idle_s > 0):
            raise ValueError(
                f"SLOs must be positive seconds, got TTFT {self.ttft_s}, TPOT {self.tpot_s}, idle {self.idle_s}"
            )


@dataclass(eq=False, slots=True)
class BrosRequest:
    """``generated`` output tokens exist; ``prompt_done`` prompt tokens are computed before the
    first (a chunked prefill under way). Of the KV the request has computed, ``host_tokens`` were
    checkpointed to host memory and must be swapped back before its next step; a ``dropped``
    request lost its KV and recomputes prompt and output as one prefill. ``chunk`` caps the
    prompt tokens the next step computes (set by the plan for this iteration only)."""

    rid: str
    realtime: bool
    arrival: float
    prompt_len: int
    generated: int = 0
    last_token_at: float | None = None
    host_tokens: int = 0
    dropped: bool = False
    seq: int = 0
    prompt_done: int = 0
    chunk: int | None = None

    def __post_init__(self) -> None:
        if self.prompt_len <= 0:
            raise ValueError(f"request {self.rid!r} has an empty prompt")

    @property
    def prefilled(self) -> bool:
        return self.generated > 0

    def deadline(self, slo: SLO) -> float:
        """When the next token is due: TTFT after arrival for the first, TPOT after the last
        one for the rest (``k_i = 1``, as systems.md reads Alg. 1)."""
        if self.last_token_at is None:
            return self.arrival + slo.ttft_s
        return self.last_token_at + slo.tpot_s

    def residual(self, now: float, slo: SLO) -> float:
        return self.deadline(slo) - now

    def is_prefill(self) -> bool:
        return not self.prefilled or self.dropped

    def prompt_left(self) -> int:
        """Prompt tokens still to compute before the first token (0 once it has one; all of them
        again if the KV of a prompt part-way through its chunks was dropped)."""
        return 0 if self.prefilled else self.prompt_len - self.prefix_tokens()

    def extend_tokens(self) -> int:
        """Tokens the next step feeds through the model."""
        if not self.prefilled:
            left = self.prompt_left()
            return left if self.chunk is None else min(self.chunk, left)
        if self.dropped:
            return self.prompt_len + self.generated
        return 1

    def prefix_tokens(self) -> int:
        """Computed tokens the next step's new ones attend to (a chunk's cached prompt part)."""
        return 0 if self.prefilled or self.dropped else self.prompt_done

    def yields_token(self) -> bool:
        """Whether the next step produces an output token (a chunk short of the prompt's end does not)."""
        return self.prefilled or self.extend_tokens() >= self.prompt_left()

    def new_slots(self) -> int:
        """Device slots the next step needs: new KV plus checkpointed tokens swapped back."""
        return self.extend_tokens() + self.host_tokens

    def add_to(self, shape: BatchShape) -> BatchShape:
        if self.is_prefill():
            return shape.with_prefill(self.extend_tokens(), self.prefix_tokens())
        return shape.with_decode(self.prompt_len + self.generated)

    def step_done(self, now: float) -> None:
        """The step ran, KV resident again: one more token, or a chunk further into the prompt."""
        self.host_tokens = 0
        if not self.yields_token():
            self.prompt_done = self.prefix_tokens() + self.extend_tokens()
        else:
            self.generated += 1
            self.last_token_at = now
            self.prompt_done = self.prompt_len
        self.dropped = False
        self.chunk = None
