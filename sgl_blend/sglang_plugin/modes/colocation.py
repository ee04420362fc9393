"""HyGen and Echo (``--colocation hygen|echo``): online requests keep their latency, offline work fills the rest.

Each iteration, before SGLang builds a batch, the mode turns the scheduler's state into an
`IterationView`, asks the `ColocationController` for a plan, and has `colocation_engine` apply it:

- online first: when online requests wait, an offline chunked prefill in flight gives up the
  chunk slot, the "batch is full" latch is reset, and offline requests give up request slots;
- the plan parks the offline decodes it skips -- held out of the batch with their KV resident and
  put back, without recompute, when a later plan keeps them -- and a decode iteration short of KV
  retracts held offline requests first, then running ones;
- the prefill adder admits offline chunks only within the plan's budget, and online requests
  take KV from running offline work when they are short of it.

HyGen and Echo differ in the controller (a latency budget, fixed or by online state, against
per-request deadlines and an online KV reserve), in Echo's KV priorities, which the radix backend reads through the
offline pool's reuser counts, and in who picks the offline work: HyGen admits it in the offline
policy's order while the budget lasts; Echo's selector (`core.echo_plan`) picks which decodes to
keep and, once the pool has ordered the waiting queue (`order_offline`), which waiting offline
requests to admit and in what order, and only those are admitted. A failure switches co-location
off (logged once) and SGLang schedules on its own; a later ``/set_internal_state`` change starts
it afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sgl_blend.core.colocation import ColocationConfig, IterationPlan
from sgl_blend.core.host_gap import batch_requests, gap_after
from sgl_blend.core.kv_priority import ReuserIndex
from sgl_blend.offline import is_offline
from sgl_blend.sglang_plugin.guard import guarded, live, switch_off
from sgl_blend.sglang_plugin.held_decodes import HeldDecodes
from sgl_blend.sglang_plugin.modes.base import HELD_FAILED, Mode
from sgl_blend.sglang_plugin.modes.colocation_engine import (
    ColocationState,
    add_offline,
    add_online,
    hold_running,
    iteration_view,
    offline_newest_first,
    park_running,
    release_to_cache,
    remaining_output,
    resume_held,
    retract_held,
    select_offline,
)

FAILED = "sgl-blend co-location failed; falling back to SGLang's own scheduling"


class ColocationMode(Mode):
    def __init__(self, config: ColocationConfig) -> None:
        super().__init__(config)
        self.held = HeldDecodes()
        self.state: ColocationState | None = ColocationState(config, self.held)

    @property
    def kv_priorities(self) -> bool:
        return self.state is not None and self.state.controller.config.kv_priorities

    def _plan(self, scheduler: Any, batch: Any) -> IterationPlan:
        """Plan the iteration over the running batch and the held decodes; preempt and hold what
        the plan says. Held decodes it keeps are put back by the caller (`before_prefill`)."""
        state = live(self.state)
        self._close_plan(state)
        state.counts["plans"] += 1
        if len(state.parked):
            queued = {req.rid for req in scheduler.waiting_queue}
            state.counts["parked_gone"] += state.parked.forget_missing(lambda rid: rid in queued or rid in self.backlog)
        state.held.sweep()
        echo = state.controller.config.mode == "echo"
        plan = state.controller.begin(
            iteration_view(scheduler, batch, state.parked.pinned_tokens(), shares=echo, held=state.held.requests())
        )
        if plan.unpin_tokens:
            state.parked.drop_newest(plan.unpin_tokens)
        preempted = set(plan.preempt)
        retract_held(
            state, scheduler, [req for req in state.held.requests() if req.rid in preempted], "preempted_for_memory"
        )
        park_running(
            state,
            scheduler,
            batch,
            [req for req in batch.reqs if req.rid in preempted],
            "preempted_for_memory",
            pin=False,
        )
        hold_running(state, scheduler, batch, set(plan.park))
        state.plan = plan
        return plan

    def _reclaim_slots(self, scheduler: Any, running_batch: Any, waiting_online: int) -> None:
        """Online requests short of request slots take them from offline work: held requests
        first (they keep a slot without running), then the newest running ones."""
        state = live(self.state)
        short = waiting_online - scheduler.get_num_allocatable_reqs(
            len(running_batch.reqs), running_batch=running_batch
        )
        if short <= 0:
            return
        held = list(reversed(state.held.requests()))[:short]
        retract_held(state, scheduler, held, "slots_reclaimed")
        short -= len(held)
        if short > 0:
            park_running(
                state, scheduler, running_batch, offline_newest_first(running_batch)[:short], "slots_reclaimed"
            )

    def before_prefill(self, scheduler: Any, running_batch: Any) -> Any:
        planned = self._plan_prefill(scheduler, running_batch)
        return planned if planned is not None else self._give_back(scheduler, running_batch)

    @guarded("held", HELD_FAILED)
    def _give_back(self, scheduler: Any, running_batch: Any) -> Any:
        """Co-location is off: every held decode goes back to SGLang as soon as it can."""
        held = live(self.held)
        held.sweep()
        return held.resume(scheduler, running_batch, held.requests())

    @guarded("state", FAILED)
    def _plan_prefill(self, scheduler: Any, running_batch: Any) -> Any:
        """Online first, then the iteration's plan; returns the running batch with the held
        decodes the plan keeps put back."""
        state = live(self.state)
        waiting_online = sum(1 for req in scheduler.waiting_queue if not is_offline(req.routing_key))
        if waiting_online:
            chunked = scheduler.chunked_req
            if chunked is not None and is_offline(chunked.routing_key):
                release_to_cache(state, chunked, scheduler.tree_cache, pin=True)
                scheduler.chunked_req = None
                scheduler._add_request_to_queue(chunked, is_retracted=True)
                state.counts["chunk_slot_reclaimed"] += 1
            running_batch.batch_is_full = False
            self._reclaim_slots(scheduler, running_batch, waiting_online)
        plan = self._plan(scheduler, running_batch)
        running_batch = resume_held(state, scheduler, running_batch, {*plan.park, *plan.preempt})
        chunked = scheduler.chunked_req
        state.continuing = None
        if chunked is not None and is_offline(chunked.routing_key):
            state.continuing = (
                len(chunked.full_untruncated_fill_ids) - chunked.prefix_len,
                chunked.prefix_len,
                remaining_output(chunked),
            )
        state.may_truncate = chunked is None and scheduler.chunked_prefill_size is not None
        return running_batch

    @guarded("state", FAILED)
    def order_offline(self, waiting_queue: list, tree_cache: Any, reusers: ReuserIndex | None) -> None:
        """Echo: pick this prefill pass's offline admissions from the queue the pool ordered."""
        state = live(self.state)
        plan = state.plan
        if plan is not None and plan.echo is not None:
            select_offline(state, waiting_queue, tree_cache, reusers)

    @guarded("state", FAILED)
    def may_admit(self, req: Any) -> bool | None:
        """Echo: an offline request the selection left out waits (None: the pool decides)."""
        plan = live(self.state).plan
        if plan is None or plan.echo is None or plan.echo.admit is None or not is_offline(req.routing_key):
            return None
        return None if req.rid in plan.echo.admit else False

    @guarded("state", FAILED)
    def before_decode(self, scheduler: Any, batch: Any) -> None:
        """The decode iteration's plan; when KV runs out, parked KV is unpinned, then held offline
        requests give theirs back, newest first, then running offline ones."""
        state = live(self.state)
        if state.plan is None:
            self._plan(scheduler, batch)
        if batch.check_decode_mem():
            return
        state.parked.drop_newest(len(batch.reqs))
        for req in reversed(state.held.requests()):
            if batch.check_decode_mem():
                return
            retract_held(state, scheduler, [req], "memory_reclaimed")
        while not batch.check_decode_mem():
            victims = offline_newest_first(batch)
            if not victims or len(batch.reqs) == 1:
                break
            park_running(state, scheduler, batch, victims[:1], "memory_reclaimed", pin=False)

    @guarded("state", FAILED)
    def end_iteration(self) -> dict[str, Any] | None:
        """What the plan spent, for the iteration record."""
        return self._close_plan(live(self.state))

    def prefill_built_nothing(self) -> dict[str, Any] | None:
        """The prefill pass's plan stands for the decode that follows: the running batch, the held
        decodes and the queue are as it saw them, and planning again would repeat its work (the
        view of the batch, the budget) on every decode iteration's scheduler time."""
        return None

    @staticmethod
    def _close_plan(state: ColocationState) -> dict[str, Any] | None:
        """Count what the iteration's plan decided and drop it; its summary. A plan kept for a decode
        that did not come (SGLang found the running batch empty) is closed by the next plan."""
        plan, state.plan = state.plan, None
        if plan is None:
            return None
        if plan.echo is not None:
            for kind, count in plan.echo.counts().items():
                state.counts[f"echo_{kind}"] += count
        return plan.summary()

    def note_arrival(self, scheduler: Any, req: Any) -> None:
        """Echo's deadlines count from when an online request first entered the scheduler."""
        if not is_offline(req.routing_key) and not hasattr(req, "blend_arrival"):
            req.blend_arrival = time.monotonic()

    @guarded("state", FAILED)
    def forward_done(self, record: dict[str, Any] | None, forward_s: float) -> None:
        """Teach the plan what the batch before this one really cost. Its launch-to-launch period
        (this record's ``period_s``) is what an online request waited for its next token: on a
        device-bound GPU server the forward, on a host-bound one (a slow host, or the emulator's
        priced device outrunning this CPU) the host's scheduling. The host's gap after that batch
        (`core.host_gap`) teaches the plan the host's time, and the period the device's
        calibration, unless the host bounded it (`ColocationController.observe`)."""
        if record is None:
            return
        state = live(self.state)
        previous, state.previous_record = state.previous_record, record
        if previous is None or (gap := gap_after(previous, record)) is None:
            return
        requests = batch_requests(previous)
        state.controller.observe_host(requests, gap)
        state.controller.observe(previous.get("model_s"), record["period_s"], requests)

    def snapshot(self) -> dict[str, Any]:
        return {"colocation": self.state.snapshot() if self.state is not None else None}

    @guarded("state", FAILED)
    def chunked_limit(self, req: Any) -> int | None:
        """The chunk an offline chunked prefill under way may run now (at least a minimal one)."""
        plan = live(self.state).plan
        if plan is None or not is_offline(req.routing_key):
            return None
        remaining = len(req.full_untruncated_fill_ids) - req.prefix_len
        return plan.budget.offline_chunk(remaining, req.prefix_len, remaining_output(req), must_progress=True)

    @guarded("state", FAILED)
    def after_chunked(self, adder: Any, req: Any, still_chunked: bool) -> None:
        plan = live(self.state).plan
        if (
            plan is None
            or not is_offline(req.routing_key)
            or not (adder.can_run_list and adder.can_run_list[-1] is req)
        ):
            return
        plan.budget.commit_offline_prefill(
            req.extend_end - req.prefix_len, req.prefix_len, not still_chunked, remaining_output(req)
        )
        if still_chunked:
            adder.rem_chunk_tokens = 0

    def admit(self, adder: Any, req: Any, has_chunked_req: bool, add: Callable[[], Any]) -> Any:
        """Within the iteration's plan; on an error the request is still admitted SGLang's way
        (unless the failed step already admitted it) and co-location is off from then on."""
        state = self.state
        if state is None or state.plan is None:
            return add()
        try:
            if is_offline(req.routing_key):
                return add_offline(state, adder, req, has_chunked_req, add)
            return add_online(state, adder, req, add)
        except Exception:
            switch_off(self, "state", FAILED)
            return adder.budget_state() if adder.can_run_list and adder.can_run_list[-1] is req else add()

    def current_config(self) -> ColocationConfig:
        return self.state.controller.config if self.state is not None else self.config

    def reconfigure(self, changes: dict[str, Any]) -> ColocationConfig:
        config = self.current_config().updated(changes)
        if self.state is not None:
            self.state.controller.reconfigure(changes)
        elif config.enabled and self.held is not None:
            self.state = ColocationState(config, self.held)
        return config
