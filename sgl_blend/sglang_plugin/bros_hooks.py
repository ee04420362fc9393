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
from sgl_blend.sglang_plugin.guard import guard

logger = logging.getLogger(__name__)
KEPT_PLANS = 32


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


_config: ColocationConfig | None = None
_state: BrosState | None = None


def active_bros() -> BrosState | None:
    return _state


def configure(config: ColocationConfig) -> None:
    """Remember the launch settings; the state starts with the first iteration, when the
    scheduler's request cap is known."""
    global _config
    _config = config
    # A warning, so it shows before SGLang has configured logging in the scheduler process.
    logger.warning("sgl-blend bros mode: Alg. 1 admission by residual time and an adaptive batch size; "
                "the radix cache is disabled in this mode (each request owns its KV slots)")


def _start(scheduler: Any) -> None:
    global _state, _config
    config, _config = _config, None
    try:
        _state = BrosState(config, int(scheduler.max_running_requests))
    except Exception:
        logger.exception("sgl-blend bros mode could not start; SGLang schedules on its own")


def _disable() -> None:
    global _state
    _state = None


guarded = guard(lambda: _state, _disable, "sgl-blend bros scheduling failed; falling back to SGLang's own scheduling")


def _request(req: Any, now: float, waiting: bool) -> BrosRequest:
    """The core's view of an engine request. One in the waiting queue with output already was
    retracted by SGLang and recomputes prompt and output as one prefill."""
    produced, last = _state.tokens.get(req.rid, (0, None))
    return BrosRequest(req.rid, not is_offline(req.routing_key), getattr(req, "blend_arrival", now),
                       max(len(req.origin_input_ids), 1), generated=produced, last_token_at=last,
                       dropped=waiting and produced > 0)


def plan_iteration(scheduler: Any, running_batch: Any) -> BrosPlan:
    """Rebuild the running set from the engine's requests and run Alg. 1 once."""
    now = time.monotonic()
    bros = BrosScheduler(_state.cost, _state.slo, _state.batch_size)
    bros.average_iteration_s = _state.average_iteration_s
    waiting = {req.rid for req in scheduler.waiting_queue}
    requests = [_request(req, now, req.rid in waiting) for req in [*running_batch.reqs, *scheduler.waiting_queue]
                if not req.finished()]
    for request in sorted(requests, key=lambda r: (r.prefilled, r.arrival)):
        bros.submit(request)
    plan = bros.plan(now, MemoryState(int(scheduler.token_to_kv_pool_allocator.available_size())))
    _state.admit = {request.rid: position for position, request in enumerate(plan.requests) if request.rid in waiting}
    _state.last_plan = plan.summary()
    _state.plans += 1
    return plan


def before_prefill(scheduler: Any, running_batch: Any) -> None:
    if _config is not None:
        _start(scheduler)
    _plan_and_order(scheduler, running_batch)


@guarded
def _plan_and_order(scheduler: Any, running_batch: Any) -> None:
    plan_iteration(scheduler, running_batch)
    order = _state.admit
    scheduler.waiting_queue.sort(key=lambda req: order.get(req.rid, len(order)))


@guarded
def end_iteration() -> None:
    _state.admit = None


@guarded
def may_admit(req: Any) -> bool | None:
    """Whether the plan admits this waiting request (None: no plan, SGLang decides)."""
    return None if _state.admit is None else req.rid in _state.admit


def note_arrival(scheduler: Any, req: Any) -> None:
    """Every new request, online or offline: its arrival starts its TTFT clock."""
    if _config is not None:
        _start(scheduler)
    if _state is None:
        return
    if not hasattr(req, "blend_arrival"):
        req.blend_arrival = time.monotonic()
    _note(req)


@guarded
def _note(req: Any) -> None:
    _state.metrics.arrived(req.rid, not is_offline(req.routing_key), req.blend_arrival)


@guarded
def forward_done(forward_s: float) -> None:
    _state.average_iteration_s += 0.2 * (forward_s - _state.average_iteration_s)


@guarded
def observe(batch: Any) -> None:
    """Fold one batch result into the token times and the metrics."""
    now = time.monotonic()
    for req in batch.reqs:
        produced = len(req.output_ids)
        before, _ = _state.tokens.get(req.rid, (0, None))
        if produced > before:
            _state.metrics.token(req.rid, now, produced - before)
            _state.tokens[req.rid] = (produced, now)
        if req.finished():
            _state.metrics.finished(req.rid, now)
            _state.tokens.pop(req.rid, None)
