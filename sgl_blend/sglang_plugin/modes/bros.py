"""BROS inside SGLang's scheduler (``sgl-blend serve --colocation bros``): Alg. 1 decides each iteration.

Online requests are real-time (RT), offline ones best-effort (BE). Each time SGLang is about to
build a batch, the scheduler's requests -- running, held back and waiting, with their arrival,
prompt, output so far, time of their last token and tokens checkpointed to host -- are described
to `sgl_blend.core.bros`, and Alg. 1 plans the iteration with the fitted latency model plus the
host's time per request (`core.host_gap.HostTime`, learnt from the iteration records' launch-to-launch
periods), the adaptive batch size and the KV pool (free slots, and the slots each BE request holds, which an
RT request may take). With ``--bros-tail-quantile`` the plan also keeps free the margin by which
that quantile of its periods ran past their plans (`cost.PeriodTail`, learnt from the same
records). The plan is applied to the engine:

- running BE decodes the plan leaves out are held back with their KV resident
  (`held_decodes`); held BE requests the plan takes are put back, their checkpointed KV first
  restored (`kv_checkpoint`); RT decodes always run;
- SGLang's prefill adder admits exactly the waiting requests the plan chose, in the plan's order
  (RT by residual time, then BE); a BE prompt the plan chunks to the residual budget (or, with no
  RT request present, to the idle cap) is admitted with that chunk and SGLang carries the rest as
  its chunked request, whose later chunks later plans size (a chunked prefill the plan leaves out
  runs `MIN_CHUNK` tokens: SGLang cannot pause it);
- an RT request short of KV -- refused by the adder, or in a decode step that does not fit --
  takes slots of BE requests, held ones first, checkpointing only the slots it takes
  (`slot_takeover`), instead of waiting or letting SGLang retract it;
- an iteration that would run nothing while BE requests are held takes one back (making room
  from the other held ones if its checkpointed KV does not fit), as Alg. 1 gives an empty batch
  its most urgent request: otherwise held KV could block everything.

The slots themselves come from SGLang's allocator, not from the core's bidirectional layout;
`kv_checkpoint` says why. The radix cache is switched off in this mode (`colocation_launch`),
since BROS's KV layout assumes a request owns its slots. If the plan fails, the mode switches
off and gives every held request back to SGLang.

Service metrics (normalized latency, TTFT/TPOT attainment, BE requests/s), the held decodes, the
checkpoint table and the takeovers are reported in ``GET /server_info`` under
``internal_states[].sgl_blend.bros``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from sgl_blend.core.bros.batch_size import AdaptiveBatchSize
from sgl_blend.core.bros.cost import IterationCost, PeriodTail
from sgl_blend.core.bros.metrics import ServiceMetrics
from sgl_blend.core.bros.packing import AVERAGE_WEIGHT, MIN_CHUNK, BrosPlan, BrosScheduler, MemoryState
from sgl_blend.core.bros.requests import SLO, BrosRequest
from sgl_blend.core.bros.takeover import plan_takeover
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.host_gap import HostTime, batch_requests, gap_after
from sgl_blend.core.kv_priority import ReuserIndex
from sgl_blend.core.latency_model import model_from_dict
from sgl_blend.offline import is_offline
from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.guard import guarded, live, switch_off
from sgl_blend.sglang_plugin.held_decodes import HeldDecodes, in_flight, resident_tokens
from sgl_blend.sglang_plugin.kv_checkpoint import KVCheckpoint
from sgl_blend.sglang_plugin.modes.base import HELD_FAILED, Mode, add_within_chunk, free_kv_tokens
from sgl_blend.sglang_plugin.slot_takeover import SlotTakeover

logger = logging.getLogger(__name__)
FAILED = "sgl-blend bros scheduling failed; falling back to SGLang's own scheduling"


def best_effort(req: Any) -> bool:
    return is_offline(req.routing_key)


def slo_of(config: ColocationConfig) -> SLO:
    """BROS's RT deadlines and idle cap from the co-location settings (BROS's defaults where unset)."""
    return SLO(config.ttft_slo_s or SLO.ttft_s, config.tpot_slo_s or SLO.tpot_s, config.idle_budget_s or math.inf)


class BrosState:
    def __init__(self, config: ColocationConfig, max_running: int) -> None:
        self.slo = slo_of(config)
        assert config.latency_model is not None, "ColocationConfig requires a latency model in bros mode"
        self.host = HostTime()
        self.tail = None if config.bros_tail_quantile is None else PeriodTail(config.bros_tail_quantile)
        self.cost = IterationCost(model_from_dict(config.latency_model), host=self.host, tail=self.tail)
        self.previous_record: dict[str, Any] | None = None  # the previous batch's, for its host gap
        self.batch_size = AdaptiveBatchSize(max_running)
        self.metrics = ServiceMetrics(self.slo, start=time.monotonic())
        self.average_iteration_s = 0.0
        self.admit: dict[str, int] | None = None
        self.chunks: dict[str, int] = {}
        self.tokens: dict[str, tuple[int, float]] = {}
        self.last_plan: dict[str, Any] = {}
        self.plans = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "metrics": self.metrics.summary(time.monotonic()),
            "batch_size": self.batch_size.current,
            "plans": self.plans,
            "last_plan": self.last_plan,
            "average_iteration_s": round(self.average_iteration_s, 6),
            "host": {
                "intercept_s": round(self.host.intercept_s, 6),
                "per_request_s": round(self.host.per_request_s, 9),
            },
            "margin_s": round(self.cost.margin_s(), 6),
        }

    def forward_done(self, record: dict[str, Any] | None, forward_s: float) -> None:
        """Teach the host-time model the gap after the previous batch (`core.host_gap`), and the
        tail (when planning to one) how far that batch's period ran past its plan's mean; after an
        idle spell there is no period (idle time is not the host's work)."""
        self.average_iteration_s += AVERAGE_WEIGHT * (forward_s - self.average_iteration_s)
        previous, self.previous_record = self.previous_record, record
        if previous is None or record is None or (gap := gap_after(previous, record)) is None:
            return
        self.host.observe(batch_requests(previous), gap)
        if self.tail is not None and "predicted_s" in previous:
            self.tail.observe(previous["predicted_s"] - previous["margin_s"], record["period_s"])

    def request(self, req: Any, now: float, waiting: bool, host_tokens: int, prompt_done: int = 0) -> BrosRequest:
        """The core's view of an engine request. One in the waiting queue with output already was
        retracted by SGLang and recomputes prompt and output as one prefill; SGLang's chunked
        request has ``prompt_done`` of its prompt computed."""
        produced, last = self.tokens.get(req.rid, (0, None))
        return BrosRequest(
            req.rid,
            not best_effort(req),
            getattr(req, "blend_arrival", now),
            max(len(req.origin_input_ids), 1),
            generated=produced,
            last_token_at=last,
            host_tokens=host_tokens,
            dropped=waiting and produced > 0,
            prompt_done=prompt_done,
        )

    def plan_iteration(
        self, scheduler: Any, running: list[Any], held: list[Any], host_tokens: Callable[[str], int]
    ) -> BrosPlan:
        """Rebuild the request set from the engine's requests and run Alg. 1 once."""
        now = time.monotonic()
        bros = BrosScheduler(self.cost, self.slo, self.batch_size)
        bros.average_iteration_s = self.average_iteration_s
        waiting = {req.rid for req in scheduler.waiting_queue}
        engine = [req for req in [*running, *held, *scheduler.waiting_queue] if not req.finished()]
        requests = [self.request(req, now, req.rid in waiting, host_tokens(req.rid)) for req in engine]
        chunked = scheduler.chunked_req
        if chunked is not None and not chunked.finished() and all(req is not chunked for req in engine):
            requests.append(self.request(chunked, now, False, 0, int(chunked.prefix_len)))
        for request in sorted(requests, key=lambda r: (r.prefilled, r.arrival)):
            bros.submit(request)
        resident = {
            req.rid: resident_tokens(req) for req in [*running, *held] if best_effort(req) and not req.finished()
        }
        plan = bros.plan(now, MemoryState(free_kv_tokens(scheduler.tree_cache), best_effort_resident=resident))
        admitted = [request.rid for request in plan.requests if request.rid in waiting]
        self.admit = {rid: rank for rank, rid in enumerate(admitted)}
        self.chunks = {request.rid: request.extend_tokens() for request in plan.best_effort if request.prompt_left()}
        # the plan's own host time: on a host-bound engine it is part of every period
        self.last_plan = {**plan.summary(), "plan_s": round(time.monotonic() - now, 6)}
        self.plans += 1
        return plan


class BrosMode(Mode):
    """The state starts with the first iteration or arrival, when the scheduler's request cap is
    known; if it cannot start, SGLang schedules on its own."""

    def __init__(self, config: ColocationConfig) -> None:
        super().__init__(config)
        self.state: BrosState | None = None
        self.held = HeldDecodes()
        self.checkpoint = KVCheckpoint()
        self.takeover = SlotTakeover(self.held, self.checkpoint, best_effort)
        self.scheduler: Any = None
        self._forward_ct = -1
        self.counts = {"held_by_plan": 0, "empty_batch_resumes": 0, "chunked_by_plan": 0}
        # A warning, so it shows before SGLang has configured logging in the scheduler process.
        logger.warning(
            "sgl-blend bros mode: Alg. 1 by residual time with an adaptive batch size; BE decodes left "
            "out are held with their KV resident, RT requests short of KV take BE slots (checkpointed "
            "to host); the radix cache is disabled in this mode (each request owns its KV slots)"
        )

    def _start(self, scheduler: Any) -> None:
        if self.scheduler is not None:
            return
        self.scheduler = scheduler
        try:
            self.state = BrosState(self.config, int(scheduler.max_running_requests))
        except Exception:
            switch_off(self, "state", "sgl-blend bros mode could not start; SGLang schedules on its own")

    def before_prefill(self, scheduler: Any, running_batch: Any) -> Any:
        self._start(scheduler)
        planned = self._plan_and_apply(scheduler, running_batch)
        return planned if planned is not None else self._give_back(scheduler, running_batch)

    @guarded("state", FAILED)
    def _plan_and_apply(self, scheduler: Any, running_batch: Any) -> Any:
        state, held = live(self.state), live(self.held)
        held.sweep()
        self.checkpoint.forget(req.rid for req in held.requests())
        plan = state.plan_iteration(scheduler, list(running_batch.reqs), held.requests(), self.checkpoint.host_tokens)
        chosen = [request.rid for request in plan.best_effort]
        keep = set(chosen)
        left_out = [req for req in running_batch.reqs if best_effort(req) and req.rid not in keep]
        self.counts["held_by_plan"] += len(held.hold(scheduler, running_batch, left_out))
        running_batch = self._resume(scheduler, running_batch, [held.get(rid) for rid in chosen if rid in held])
        if running_batch.is_empty() and held.any() and self._stalled(scheduler):
            running_batch = self._resume_one(scheduler, running_batch)
        self._forward_ct = scheduler.forward_ct
        return running_batch

    def _stalled(self, scheduler: Any) -> bool:
        """Nothing decodes while requests are held, and nothing else will run: the plan admits no
        one, or what it admitted last time did not run (SGLang's adder refused it)."""
        return not live(self.state).admit or scheduler.forward_ct == self._forward_ct

    def _resume(self, scheduler: Any, running_batch: Any, reqs: list[Any]) -> Any:
        """Put ``reqs`` back into the running batch, each once its checkpointed KV is restored."""
        held = live(self.held)
        ready = [req for req in reqs if held.resumable(scheduler, req) or self._restorable(scheduler, req)]
        return held.resume(scheduler, running_batch, ready)

    def _restorable(self, scheduler: Any, req: Any) -> bool:
        return (
            self.checkpoint.host_tokens(req.rid) > 0
            and not req.finished()
            and self.checkpoint.restore(scheduler, req)
            and live(self.held).resumable(scheduler, req)
        )

    def _resume_one(self, scheduler: Any, running_batch: Any) -> Any:
        """Take back the held request with the least KV on host, making room from the other held
        ones when its KV does not fit (Alg. 1: an empty batch takes its most urgent request)."""
        held = live(self.held)
        flying = in_flight(scheduler)
        candidates = [req for req in held.requests() if not req.finished() and id(req) not in flying]
        if not candidates:
            return running_batch
        req = min(candidates, key=lambda r: self.checkpoint.host_tokens(r.rid))
        missing = self.checkpoint.host_tokens(req.rid) - free_kv_tokens(scheduler.tree_cache)
        others = {
            other.rid: resident_tokens(other) for other in held.requests() if other is not req and not other.finished()
        }
        for take in plan_takeover(missing, others, {}):
            self.checkpoint.take(scheduler, held.get(take.rid), take.tokens)
        resumed = self._resume(scheduler, running_batch, [req])
        self.counts["empty_batch_resumes"] += not resumed.is_empty()
        return resumed

    @guarded("held", HELD_FAILED)
    def _give_back(self, scheduler: Any, running_batch: Any) -> Any:
        """The plan is off: every held request goes back to SGLang as soon as it can."""
        held = live(self.held)
        held.sweep()
        self.checkpoint.forget(req.rid for req in held.requests())
        return self._resume(scheduler, running_batch, held.requests())

    def before_decode(self, scheduler: Any, batch: Any) -> None:
        self._decode_room(scheduler, batch)

    @guarded("state", FAILED)
    def _decode_room(self, scheduler: Any, batch: Any) -> None:
        self.takeover.decode(scheduler, batch)

    @guarded("state", FAILED)
    def end_iteration(self) -> dict[str, Any] | None:
        """Drop the iteration's plan; the iteration record carries its summary (``predicted_s``
        beside the record's measured times shows what the cost model missed)."""
        state = live(self.state)
        planned = state.admit is not None
        state.admit = None
        state.chunks = {}
        return state.last_plan if planned else None

    @guarded("state", FAILED)
    def order_offline(self, waiting_queue: list, tree_cache: Any, reusers: ReuserIndex | None) -> None:
        """The waiting queue in the plan's order, over the offline pool's: SGLang's adder stops at
        the first request the plan leaves out, so any other order admits only what happens to
        come first."""
        order = live(self.state).admit
        if order is not None:
            waiting_queue.sort(key=lambda req: order.get(req.rid, len(order)))

    @guarded("state", FAILED)
    def may_admit(self, req: Any) -> bool | None:
        """Whether the plan admits this waiting request (None: no plan, SGLang decides)."""
        admit = live(self.state).admit
        return None if admit is None else req.rid in admit

    def admit(self, adder: Any, req: Any, has_chunked_req: bool, add: Callable[[], Any]) -> Any:
        """An RT request the adder refuses for want of KV takes it from BE requests; a BE prompt
        is admitted with the chunk the plan gives it."""
        if self.state is None:
            return add()
        try:
            if best_effort(req):
                return self._admit_chunk(adder, req, has_chunked_req, add)
            return self.takeover.admit(self.scheduler, adder, req, add)
        except Exception:
            switch_off(self, "state", FAILED)
            return sgl.AddReqResult.OTHER

    def _admit_chunk(self, adder: Any, req: Any, has_chunked_req: bool, add: Callable[[], Any]) -> Any:
        """Within the plan's chunk; a truncated prompt ends the pass, as SGLang's own does. While
        SGLang carries a chunked request already, a prompt that would be truncated waits (SGLang
        carries one at a time)."""
        chunk = live(self.state).chunks.get(req.rid)
        if chunk is None:
            return add()
        if has_chunked_req and chunk < len(req.full_untruncated_fill_ids) - req.prefix_len:
            return sgl.AddReqResult.OTHER
        result = add_within_chunk(adder, chunk, add)
        if adder.new_chunked_req is not req:
            return result
        self.counts["chunked_by_plan"] += 1
        adder.rem_chunk_tokens = 0
        return sgl.AddReqResult.OTHER

    @guarded("state", FAILED)
    def chunked_limit(self, req: Any) -> int | None:
        """A BE chunked prefill under way runs the chunk the plan gives it, or a minimal one."""
        if not best_effort(req):
            return None
        return live(self.state).chunks.get(req.rid, MIN_CHUNK)

    def note_arrival(self, scheduler: Any, req: Any) -> None:
        """Every new request, online or offline: its arrival starts its TTFT clock."""
        self._start(scheduler)
        if self.state is None:
            return
        if not hasattr(req, "blend_arrival"):
            req.blend_arrival = time.monotonic()
        self._note(req)

    @guarded("state", FAILED)
    def _note(self, req: Any) -> None:
        live(self.state).metrics.arrived(req.rid, not best_effort(req), req.blend_arrival)

    @guarded("state", FAILED)
    def forward_done(self, record: dict[str, Any] | None, forward_s: float) -> None:
        live(self.state).forward_done(record, forward_s)

    @guarded("state", FAILED)
    def observe_batch(self, batch: Any) -> None:
        """Fold one batch result into the token times and the metrics."""
        state = live(self.state)
        now = time.monotonic()
        for req in batch.reqs:
            produced = len(req.output_ids)
            before, _ = state.tokens.get(req.rid, (0, None))
            if produced > before:
                state.metrics.token(req.rid, now, produced - before)
                state.tokens[req.rid] = (produced, now)
            if req.finished():
                state.metrics.finished(req.rid, now)
                state.tokens.pop(req.rid, None)

    def reconfigure(self, changes: dict[str, Any]) -> ColocationConfig:
        """New deadlines or idle cap (``/set_internal_state``) take effect from the next plan."""
        config = super().reconfigure(changes)
        if self.state is not None:
            self.state.slo = self.state.metrics.slo = slo_of(config)
        return config

    def snapshot(self) -> dict[str, Any]:
        """The plan's state, and where the KV is: free slots of the pool (``kv_free`` of
        ``kv_total``), held requests' resident slots (``held``), checkpointed tokens on host
        (``checkpoint``)."""
        if self.state is None:
            return {"bros": None}
        allocator = self.scheduler.token_to_kv_pool_allocator
        return {
            "bros": {
                **self.state.snapshot(),
                "held": self.held.snapshot() if self.held is not None else None,
                "checkpoint": self.checkpoint.snapshot(),
                "takeover": {**self.takeover.counts, **self.counts},
                "kv_free": int(allocator.available_size()),
                "kv_total": int(allocator.size),
            }
        }
