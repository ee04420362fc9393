"""BROS inside SGLang's scheduler (``sgl-blend serve --colocation bros``): Alg. 1 chooses admissions.

Each time SGLang is about to build a prefill batch, the scheduler's requests are described to
`sgl_blend.core.bros` -- online requests as real-time (RT), offline ones as best-effort (BE),
with their arrival, prompt, output so far and the time of their last token -- and Alg. 1 plans
the iteration with the fitted latency model, the adaptive batch size and the KV pool's free
slots. The plugin then lets SGLang's prefill adder admit exactly the waiting requests the plan
chose, in the plan's order (RT by residual time, then BE), and nothing else.

What this mode does not do inside the engine (it is modelled in `sgl_blend.sim.bros_engine`
and the allocator is tested on tensors): SGLang still decodes every running request each
iteration, so a decode the plan leaves out is not held back, and KV slots come from SGLang's own
allocator, so RT requests do not take BE slots. The radix cache is switched off in this mode
(`colocation_launch`), since BROS's KV layout assumes a request owns its slots.

Service metrics (normalized latency, TTFT/TPOT attainment, BE requests/s) are folded in from
every batch result and reported in ``GET /server_info`` under ``internal_states[].sgl_blend.bros``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sgl_blend.core.bros.batch_size import AdaptiveBatchSize
from sgl_blend.core.bros.cost import IterationCost
from sgl_blend.core.bros.metrics import ServiceMetrics
from sgl_blend.core.bros.packing import BrosPlan, BrosScheduler, MemoryState
from sgl_blend.core.bros.requests import SLO, BrosRequest
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.latency_model import model_from_dict
from sgl_blend.offline import is_offline
from sgl_blend.sglang_plugin.guard import guarded
from sgl_blend.sglang_plugin.modes.base import Mode

logger = logging.getLogger(__name__)
FAILED = "sgl-blend bros scheduling failed; falling back to SGLang's own scheduling"


class BrosState:
    def __init__(self, config: ColocationConfig, max_running: int) -> None:
        self.slo = SLO(config.ttft_slo_s or SLO.ttft_s, config.tpot_slo_s or SLO.tpot_s)
        self.cost = IterationCost(model_from_dict(config.latency_model))
        self.batch_size = AdaptiveBatchSize(max_running)
        self.metrics = ServiceMetrics(self.slo, start=time.monotonic())
        self.average_iteration_s = 0.0
        self.admit: dict[str, int] | None = None
        self.tokens: dict[str, tuple[int, float]] = {}
        self.last_plan: dict[str, Any] = {}
        self.plans = 0

    def snapshot(self) -> dict[str, Any]:
        return {"metrics": self.metrics.summary(time.monotonic()), "batch_size": self.batch_size.current, "plans": self.plans,
                "last_plan": self.last_plan, "average_iteration_s": round(self.average_iteration_s, 6)}

    def request(self, req: Any, now: float, waiting: bool) -> BrosRequest:
        """The core's view of an engine request. One in the waiting queue with output already was
        retracted by SGLang and recomputes prompt and output as one prefill."""
        produced, last = self.tokens.get(req.rid, (0, None))
        return BrosRequest(req.rid, not is_offline(req.routing_key), getattr(req, "blend_arrival", now),
                           max(len(req.origin_input_ids), 1), generated=produced, last_token_at=last,
                           dropped=waiting and produced > 0)

    def plan_iteration(self, scheduler: Any, running_batch: Any) -> BrosPlan:
        """Rebuild the running set from the engine's requests and run Alg. 1 once."""
        now = time.monotonic()
        bros = BrosScheduler(self.cost, self.slo, self.batch_size)
        bros.average_iteration_s = self.average_iteration_s
        waiting = {req.rid for req in scheduler.waiting_queue}
        requests = [self.request(req, now, req.rid in waiting)
                    for req in [*running_batch.reqs, *scheduler.waiting_queue] if not req.finished()]
        for request in sorted(requests, key=lambda r: (r.prefilled, r.arrival)):
            bros.submit(request)
        plan = bros.plan(now, MemoryState(int(scheduler.token_to_kv_pool_allocator.available_size())))
        self.admit = {request.rid: position for position, request in enumerate(plan.requests) if request.rid in waiting}
        self.last_plan = plan.summary()
        self.plans += 1
        return plan


class BrosMode(Mode):
    """The state starts with the first iteration or arrival, when the scheduler's request cap is
    known; if it cannot start, SGLang schedules on its own."""

    def __init__(self, config: ColocationConfig) -> None:
        super().__init__(config)
        self.state: BrosState | None = None
        self._started = False
        # A warning, so it shows before SGLang has configured logging in the scheduler process.
        logger.warning("sgl-blend bros mode: Alg. 1 admission by residual time and an adaptive batch size; "
                       "the radix cache is disabled in this mode (each request owns its KV slots)")

    def _start(self, scheduler: Any) -> None:
        if self._started:
            return
        self._started = True
        try:
            self.state = BrosState(self.config, int(scheduler.max_running_requests))
        except Exception:
            logger.exception("sgl-blend bros mode could not start; SGLang schedules on its own")

    def before_prefill(self, scheduler: Any, running_batch: Any) -> None:
        self._start(scheduler)
        self._plan_and_order(scheduler, running_batch)

    @guarded("state", FAILED)
    def _plan_and_order(self, scheduler: Any, running_batch: Any) -> None:
        self.state.plan_iteration(scheduler, running_batch)
        order = self.state.admit
        scheduler.waiting_queue.sort(key=lambda req: order.get(req.rid, len(order)))

    @guarded("state", FAILED)
    def end_iteration(self) -> None:
        self.state.admit = None

    @guarded("state", FAILED)
    def may_admit(self, req: Any) -> bool | None:
        """Whether the plan admits this waiting request (None: no plan, SGLang decides)."""
        return None if self.state.admit is None else req.rid in self.state.admit

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
        self.state.metrics.arrived(req.rid, not is_offline(req.routing_key), req.blend_arrival)

    @guarded("state", FAILED)
    def forward_done(self, record: dict[str, Any] | None, forward_s: float) -> None:
        self.state.average_iteration_s += 0.2 * (forward_s - self.state.average_iteration_s)

    @guarded("state", FAILED)
    def observe_batch(self, batch: Any) -> None:
        """Fold one batch result into the token times and the metrics."""
        state = self.state
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

    def snapshot(self) -> dict[str, Any]:
        return {"bros": self.state.snapshot() if self.state is not None else None}
