"""An iteration-level model of SGLang's engine on a modelled GPU, driving a real `AdmissionPolicy`.

Requests reach the scheduler through a `Feeder`: the batch runner's window of planned lines
(`feed.RunnerFeed`, what run-batch and the Batch API do), or the whole batch at once
(`WholeBatch`, offline work sent to ``serve`` without a plan). Each iteration, as SGLang's
scheduler does it:

1. Admission. The policy is offered the KV that is free once the running requests' future output
   is reserved (``min(max_new - decoded, 4096)`` tokens each, times the new-token ratio, or times 1
   for ``ignore_eos`` requests); the engine admits a prefix of its proposal, stopping at the first
   request whose prompt plus its own unscaled reserve ``min(max_new - decoded, 4096)`` does not
   fit (``PrefillAdder.add_one_req``), or once this iteration's prefill room is used.
   Shared prompt segments come from the radix cache when resident and computed by an earlier
   forward (LRU eviction of unreferenced ones makes room).
2. One mixed step: every decoding request produces a token; prefill chunks -- the one carried
   over first, then the new ones, the last possibly cut -- fill the prefill room, and a request
   whose prefill completes produces its first token in the same step (so a request of ``d``
   output tokens decodes ``d - 1`` times, and its context at each decode counts the token fed in). The room is
   `prefill_room` (the rule the SGLang plugin calls too): the engine's chunk
   (``EngineConfig.token_budget``, a setting swept alike for every policy) less the decodes,
   capped by the policy's ``prefill_token_budget`` when it paces prefill (Alg. 3's ``C_L + C_R``).
3. Time: ``f(comp, mem)`` with both sides priced by `IterationCost`: the linear layers cost
   ``max(tokens * 2P / FLOPs, weight read)``, so a small decode-only batch is weight-bandwidth
   bound, plus prefill attention; the memory side is the decodes' KV reads. The schedule never
   depends on time, so one run is priced under several overlap functions at once
   (``also_price``), e.g. both measured lambdas. The policy is told how many iterations ran
   (``advance``), its clock for per-iteration pacing.
4. KV that would overflow retracts requests (fewest decoded tokens first, like SGLang); they keep
   their output and recompute prompt and output as prefill when they return.
5. A finished request's unique tail and output stay in the radix cache as evictable leaves (as
   SGLang's tree keeps them) until LRU eviction takes them, so prefix sharing depends on order.

Only the engine knows true output lengths, and it uses them only to stop a request. Long
decode-only stretches, when the policy proposes nothing that fits, run in closed form up to the
next finish (at most ``max_stretch`` iterations); a pacing policy may wait that long for its
next admission, which can only cost it. Measured on Trace#2 at 5K requests, 2048 chunk: with
``max_stretch=1`` (no closed form) dfs+pacing is 1.2% faster and BlendServe and DFS are
unchanged, so the closed form is not what makes pacing slow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sgl_blend.core.cost_model import (
    CLIP_MAX_NEW_TOKENS,
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    CostModel,
)
from sgl_blend.core.prefill_room import prefill_room
from sgl_blend.core.protocol import AdmissionPolicy, OfflineRequest
from sgl_blend.forward_time.iteration_cost import IterationCost
from sgl_blend.forward_time.overlap import OverlapFunction
from sgl_blend.sim.kv_cache import RadixKVCache
from sgl_blend.sim.metrics import SimResult, StepTrace
from sgl_blend.sim.workload import SimRequest


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits. ``kv_capacity`` None means what the hardware's KV memory holds;
    ``token_budget`` is the prefill chunk (SGLang's ``chunked_prefill_size``) that decodes share."""

    kv_capacity: int | None = None
    token_budget: int = 2048
    max_running: int = 1024
    page_size: int = 1
    max_stretch: int = 256
    proposal_size: int = 16
    progress_interval: int = 32


class Feeder(Protocol):
    """What hands requests to the scheduler, and when: some at the start, more as requests finish."""

    def start(self) -> Iterable[OfflineRequest]: ...

    def finished(self, rid: str, output_len: int) -> Iterable[OfflineRequest]: ...


class WholeBatch:
    """Every request at once, unplanned and in the given order: offline work sent to ``serve``
    without a plan, which the in-engine policy orders by itself."""

    def __init__(self, requests: Sequence[SimRequest]) -> None:
        self.requests = requests

    def start(self) -> Iterable[OfflineRequest]:
        return [OfflineRequest(r.rid, r.prompt_ids(), r.max_new_tokens, r.exact) for r in self.requests]

    def finished(self, rid: str, output_len: int) -> Iterable[OfflineRequest]:
        return ()


class SimEngine:
    def __init__(
        self,
        cost: CostModel,
        policy: AdmissionPolicy,
        overlap: OverlapFunction,
        config: EngineConfig = EngineConfig(),
        also_price: Sequence[OverlapFunction] = (),
    ) -> None:
        self.cost = cost
        self.policy = policy
        self.overlap = overlap
        # The primary overlap first; the run's seconds under each land in `SimResult.seconds_under`.
        self.overlaps = (overlap, *(extra for extra in also_price if extra.name != overlap.name))
        self.config = config
        self.capacity = config.kv_capacity or cost.kv_capacity_tokens()
        # Chunks add up to p^2 / 2 query-key pairs per prompt; 8 H L per pair is the model's 4 p^2 H L.
        self.step = IterationCost.of(cost)
        self._ratio_decay = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS

    def run(
        self,
        requests: Sequence[SimRequest],
        feeder: Feeder | None = None,
        on_finish: Callable[[int], None] | None = None,
    ) -> SimResult:
        """Run ``requests`` (their true output lengths stop them) as ``feeder`` hands them over
        (default: `WholeBatch`)."""
        return _Run(self, requests, feeder or WholeBatch(requests), on_finish).execute()


class _Run:
    """The state of one simulation: per-request arrays, and per-slot arrays for what runs."""

    def __init__(
        self, engine: SimEngine, requests: Sequence[SimRequest], feeder: Feeder, on_finish: Callable[[int], None] | None
    ) -> None:
        self.engine = engine
        self.cfg = engine.config
        self.policy = engine.policy
        self.requests = requests
        self.feeder = feeder
        self.on_finish = on_finish
        self.index = {request.rid: i for i, request in enumerate(requests)}
        if len(self.index) != len(requests):
            raise ValueError("request ids must be unique")
        self.cache = RadixKVCache(self.cfg.page_size)
        self.capacity = engine.capacity
        self.generated = np.zeros(len(requests), dtype=np.int64)
        self.seen = np.zeros(len(requests), dtype=bool)
        slots = self.cfg.max_running
        self.slot_request = np.full(slots, -1, dtype=np.int64)
        self.prompt = np.zeros(slots, dtype=np.int64)
        self.decoded = np.zeros(slots, dtype=np.int64)
        self.target = np.zeros(slots, dtype=np.int64)
        self.max_new = np.zeros(slots, dtype=np.int64)
        self.exact = np.zeros(slots, dtype=bool)
        self.private = np.zeros(slots, dtype=np.int64)  # unique-tail and output tokens, unpaged
        self.prefill_left = np.zeros(slots, dtype=np.int64)
        self.done_before = np.zeros(slots, dtype=np.int64)
        self.active = np.zeros(slots, dtype=bool)
        self.free_slots = list(range(slots - 1, -1, -1))
        self.prefill_queue: list[int] = []
        self.private_used = 0
        self.ratio = INIT_NEW_TOKEN_RATIO
        self.admitted_order: list[str] = []
        self.finished: dict[str, int] = {}
        self.trace = StepTrace()
        self.clock = self.comp_total = self.mem_total = 0.0
        self.clocks = [0.0] * len(engine.overlaps)
        self.cached = self.iterations = self.retractions = self.peak_kv = 0

    @property
    def kv_used(self) -> int:
        return self.cache.used + self.private_used

    def execute(self) -> SimResult:
        self.policy.set_kv_capacity(self.capacity)
        self.policy.submit(self.feeder.start())
        while len(self.finished) < len(self.requests):
            decoding = np.flatnonzero(self.active & (self.prefill_left == 0))
            admitted = self._admit(len(decoding))
            if not self.active.any():
                raise RuntimeError(
                    f"{len(self.requests) - len(self.finished)} requests left but the policy "
                    "proposed nothing that fits in an empty engine"
                )
            if self.prefill_queue or admitted:
                self._mixed_step(decoding)
            else:
                self._decode_stretch(decoding)
        requests = self.requests
        return SimResult(
            getattr(self.policy, "name", type(self.policy).__name__),
            self.clock,
            sum(r.prompt_len for r in requests),
            sum(r.output_len for r in requests),
            self.cached,
            self.comp_total,
            self.mem_total,
            self.iterations,
            self.retractions,
            self.peak_kv,
            self.capacity,
            self.admitted_order,
            self.finished,
            self.trace,
            {overlap.name: clock for overlap, clock in zip(self.engine.overlaps, self.clocks)},
        )

    def _prefill_room(self, n_decode: int) -> int:
        return prefill_room(self.cfg.token_budget, n_decode, self.policy.prefill_token_budget())

    def _reserve(self) -> float:
        active = self.active
        left = np.minimum(self.max_new[active] - self.decoded[active], CLIP_MAX_NEW_TOKENS)
        return float(np.sum(left * np.where(self.exact[active], 1.0, self.ratio)))

    def _admit(self, n_decode: int) -> int:
        """Admit from the policy's proposals while prefill room, slots and KV last. Proposals are
        asked for a few at a time: the room rarely takes more, and a long proposal is wasted work."""
        room = self._prefill_room(n_decode) - sum(int(self.prefill_left[slot]) for slot in self.prefill_queue)
        admitted = 0
        while room > 0 and self.free_slots:
            free = self.capacity - self.kv_used + self.cache.evictable - self._reserve()
            proposal = self.policy.propose(max(int(free), 0), min(len(self.free_slots), self.cfg.proposal_size))
            taken: list[str] = []
            for offered in proposal:
                if room <= 0 or not self.free_slots:
                    break
                i = self.index[offered.rid]
                request = self.requests[i]
                generated = int(self.generated[i])
                hit = self.cache.cached_prefix(request.prefix)
                extend = request.prompt_len - hit + generated
                reserve = min(request.max_new_tokens - generated, CLIP_MAX_NEW_TOKENS)
                if extend + reserve > free and self.active.any():
                    break
                private = request.unique_len + generated
                if not self._make_room_for(request, self.cache.pages(private)):
                    break
                extend = request.prompt_len - self.cache.cached_prefix(request.prefix) + generated
                self._start(i, request, private, generated)
                free -= extend + reserve
                room -= extend
                taken.append(request.rid)
            self.policy.admitted(taken)
            admitted += len(taken)
            if not taken or len(taken) < len(proposal):
                break
        return admitted

    def _make_room_for(self, request: SimRequest, private_pages: int) -> bool:
        """Evict until the request's missing segments and private pages fit. Eviction may take a
        segment of its own prefix, which it then needs again, hence the loop."""
        while True:
            short = self.cache.missing_tokens(request.prefix) + private_pages - (self.capacity - self.kv_used)
            if short <= 0:
                return True
            if not self.cache.evict(short):
                return False

    def _start(self, i: int, request: SimRequest, private: int, generated: int) -> None:
        hit = self.cache.acquire(request.prefix)
        if not self.seen[i]:
            self.seen[i] = True
            self.cached += hit
            self.admitted_order.append(request.rid)
        slot = self.free_slots.pop()
        self.slot_request[slot] = i
        self.prompt[slot] = request.prompt_len
        self.decoded[slot] = generated
        self.target[slot] = request.output_len
        self.max_new[slot] = request.max_new_tokens
        self.exact[slot] = request.exact
        self.private[slot] = private
        self.prefill_left[slot] = max(1, request.prompt_len + generated - hit)
        self.done_before[slot] = request.prompt_len + generated - self.prefill_left[slot]
        self.active[slot] = True
        self.private_used += self.cache.pages(private)
        self.prefill_queue.append(slot)
        self.peak_kv = max(self.peak_kv, self.kv_used)

    def _mixed_step(self, decoding: np.ndarray) -> None:
        """One iteration; ``decoding`` holds the slots that decode in it."""
        engine = self.engine
        decoding = self._make_room(decoding)
        n_decode = len(decoding)
        room = self._prefill_room(n_decode)
        tokens, pairs = n_decode, 0.0
        prefilled = []
        while self.prefill_queue and room > 0:
            slot = self.prefill_queue[0]
            chunk = min(int(self.prefill_left[slot]), room)
            before = int(self.done_before[slot])
            tokens += chunk
            pairs += chunk * (before + chunk / 2.0)
            self.prefill_left[slot] -= chunk
            self.done_before[slot] = before + chunk
            room -= chunk
            if self.prefill_left[slot] == 0:
                prefilled.append(self.prefill_queue.pop(0))
        comp = engine.step.compute_side(tokens, pairs)
        mem = engine.step.memory_side(float((self.prompt[decoding] + self.decoded[decoding]).sum()))
        self._account(1, comp, mem, [overlap(comp, mem) for overlap in engine.overlaps], n_decode, tokens - n_decode)
        self._advance(decoding, 1)
        self._first_tokens(np.array(prefilled, dtype=np.int64))

    def _decode_stretch(self, decoding: np.ndarray) -> None:
        """Decode-only steps up to the next finish (or KV exhaustion), in closed form."""
        engine = self.engine
        n = len(decoding)
        # Finished requests' cached tails are evictable: a stretch may take their room.
        headroom = self.capacity - self.kv_used + self.cache.evictable
        steps = int((self.target[decoding] - self.decoded[decoding]).min())
        steps = max(1, min(steps, self.cfg.max_stretch, headroom // (n * self.cfg.page_size)))
        if steps == 1:
            self._mixed_step(decoding)
            return
        short = self._new_pages(decoding, steps) - (self.capacity - self.kv_used)
        if short > 0:
            self.cache.evict(short)
        context = float((self.prompt[decoding] + self.decoded[decoding]).sum())
        comp = np.full(steps, engine.step.compute_side(n, 0.0))
        mem = engine.step.memory_side(context + n * np.arange(steps))
        self._account(
            steps,
            float(comp.sum()),
            float(mem.sum()),
            [float(overlap.vector(comp, mem).sum()) for overlap in engine.overlaps],
            n,
            0,
        )
        self._advance(decoding, steps)

    def _account(self, steps: int, comp: float, mem: float, seconds: list[float], decodes: int, prefill: int) -> None:
        """Book ``steps`` iterations of ``decodes`` decoding requests and ``prefill`` prompt tokens
        in all; ``seconds`` holds their time under each of the engine's overlaps."""
        self.clock += seconds[0]
        for index, value in enumerate(seconds):
            self.clocks[index] += value
        self.comp_total += comp
        self.mem_total += mem
        self.iterations += steps
        self.trace.add(steps, comp, mem, seconds[0], decodes, prefill)
        self.ratio = max(MIN_NEW_TOKEN_RATIO, self.ratio - self.engine._ratio_decay * steps)
        self.cache.advance(steps)
        self.policy.advance(steps)

    def _make_room(self, decoding: np.ndarray) -> np.ndarray:
        """Free KV for this step's new tokens: evict cached segments, then retract requests."""
        while True:
            need = self._new_pages(decoding, 1)
            short = need - (self.capacity - self.kv_used)
            if short <= 0:
                return decoding
            self.cache.evict(short)
            if self.capacity - self.kv_used >= need:
                return decoding
            if len(decoding) > 1:
                order = np.lexsort((-self.prompt[decoding], self.decoded[decoding]))
                self._retract(int(decoding[order[0]]))
            elif self.prefill_queue:
                self._retract(self.prefill_queue[-1])
            else:
                raise RuntimeError("KV capacity cannot hold a single running request")
            decoding = decoding[self.active[decoding]]

    def _new_pages(self, decoding: np.ndarray, steps: int) -> int:
        """Pages the decoding requests' private KV grows by in ``steps`` tokens."""
        page = self.cfg.page_size
        if page == 1:
            return len(decoding) * steps
        private = self.private[decoding]
        return int(((private + steps + page - 1) // page - (private + page - 1) // page).sum()) * page

    def _retract(self, slot: int) -> None:
        i = int(self.slot_request[slot])
        self.generated[i] = self.decoded[slot]
        if slot in self.prefill_queue:
            self.prefill_queue.remove(slot)
        self._release(slot)
        self.retractions += 1
        self.ratio = INIT_NEW_TOKEN_RATIO
        self.policy.preempted(self.requests[i].rid)

    def _release(self, slot: int, keep_tail: bool = False) -> None:
        """Free a slot. A finished request (``keep_tail``) hands its private tokens to the radix
        cache as an evictable leaf, as SGLang's tree keeps a finished sequence; a retracted one
        frees them."""
        i = int(self.slot_request[slot])
        private = int(self.private[slot])
        if keep_tail:
            self.cache.retain(f"\0tail/{self.requests[i].rid}", private)
        self.cache.release(self.requests[i].prefix)
        self.private_used -= self.cache.pages(private)
        self.active[slot] = False
        self.slot_request[slot] = -1
        self.free_slots.append(slot)

    def _advance(self, decoding: np.ndarray, steps: int) -> None:
        self.private_used += self._new_pages(decoding, steps)
        before = self.decoded[decoding]
        after = before + steps
        self.private[decoding] += steps
        self.decoded[decoding] = after
        self.peak_kv = max(self.peak_kv, self.kv_used)
        interval = self.cfg.progress_interval
        crossed = decoding[(before // interval) != (after // interval)]
        for slot in decoding[after >= self.target[decoding]]:
            self._finish(int(slot))
        for slot in crossed:
            if self.active[slot]:
                self.policy.progress(self.requests[int(self.slot_request[slot])].rid, int(self.decoded[slot]))

    def _first_tokens(self, prefilled: np.ndarray) -> None:
        """Requests whose prefill completed sample their next token from it, as SGLang's extend
        forward does; its KV is written when it is fed in, at the next decode."""
        if not len(prefilled):
            return
        self.decoded[prefilled] += 1
        for slot in prefilled[self.decoded[prefilled] >= self.target[prefilled]]:
            self._finish(int(slot))

    def _finish(self, slot: int) -> None:
        i = int(self.slot_request[slot])
        rid = self.requests[i].rid
        if rid in self.finished:
            raise RuntimeError(f"request {rid} finished twice")
        self.finished[rid] = int(self.decoded[slot])
        self._release(slot, keep_tail=True)
        self.policy.finished(rid, self.finished[rid])
        self.policy.submit(self.feeder.finished(rid, self.finished[rid]))
        if self.on_finish:
            self.on_finish(1)
