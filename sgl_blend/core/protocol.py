"""The one boundary between an engine and an offline admission policy.

Both engines that drive the core -- the SGLang plugin inside the real scheduler and the simulator --
talk to a policy only through `AdmissionPolicy`. The engine owns memory, batches and time; the
policy owns order. Keeping the boundary this narrow is what lets a simulated 400K-request run and a
real server exercise the very same policy code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sgl_blend.core.placement import Placement


@dataclass(frozen=True, slots=True)
class OfflineRequest:
    """An offline request as the policy sees it: token ids and an output-length bound.

    `exact_output_len` is true when the output length is known in advance (``ignore_eos`` with
    ``max_new_tokens``): such a request needs no output-length sample. ``placement`` is its place
    in a global plan made outside the engine; a policy admits placed requests by it.
    """

    rid: str
    prompt_ids: Sequence[int]
    max_new_tokens: int
    exact_output_len: bool = False
    placement: Placement | None = None


class AdmissionPolicy(Protocol):
    """What an engine calls, in this order, on every scheduling iteration.

    1. `submit` new offline requests whenever they arrive.
    2. `propose(free_kv_tokens, max_requests)` returns the requests the policy wants admitted now,
       in admission order. The engine admits a prefix of that list (it stops at the first request
       that does not fit its own budgets) and reports the admitted rids with `admitted`.
       Requests not admitted stay pending and may be proposed again.
    3. While requests run, the engine reports `progress` (tokens decoded so far) so the policy can
       adapt, `preempted` when it retracts a request (it becomes pending again), and `finished`
       with the real output length. `prefill_continues` when the engine gives a chunked
       request its next prefill chunk: the prefix it computes is not cached until the last one.
    4. `withdraw` removes a pending request that will never run (its client aborted it).
    5. `advance(iterations)` after every forward pass (a closed-form stretch of decode-only
       iterations reports them all at once): the policy's clock. A policy that paces admissions
       per iteration (BlendServe's per-side budgets of Alg. 3) earns its allowance on it, so an
       engine that never calls it gets only what an idle engine may always start.

    `prefill_token_budget` is how many prefill tokens the policy wants in the next iteration
    (BlendServe's per-side budgets ``C_L + C_R``), or None to keep the engine's own chunk size.

    `annotation` gives, for a pending request, the compute density the policy planned with and
    how many pending requests share its prompt prefix: what the radix cache records on its nodes.

    `admission_side` names the scan side a request was admitted from ("compute" or "memory" for
    BlendServe's dual scan; None for single-order policies), for per-iteration records.
    """

    def set_kv_capacity(self, kv_tokens: int) -> None: ...

    def submit(self, requests: Iterable[OfflineRequest]) -> None: ...

    def propose(self, free_kv_tokens: int, max_requests: int) -> list[OfflineRequest]: ...

    def admitted(self, rids: Iterable[str]) -> None: ...

    def prefill_continues(self, rid: str) -> None: ...

    def progress(self, rid: str, decoded_tokens: int) -> None: ...

    def preempted(self, rid: str) -> None: ...

    def finished(self, rid: str, output_len: int) -> None: ...

    def withdraw(self, rid: str) -> None: ...

    def advance(self, iterations: int) -> None: ...

    def admission_side(self, rid: str) -> str | None: ...

    def prefill_token_budget(self) -> int | None: ...

    def annotation(self, rid: str) -> tuple[float, int] | None: ...

    def pending_count(self) -> int: ...
