"""Everything the plugin keeps in one SGLang process, in one object that `register` creates.

SGLang's hooks are plain functions patched into its classes, so whatever they share must live
somewhere they can all reach. It lives here, created once per process from the launcher's
`PluginSettings` and handed to every hook, to the prefill adder and to the radix backend: the
offline pool (created on the scheduler's first ordering, when the KV pool's size is known), the
per-iteration record, and the one scheduling mode (`modes`). Each part is switched off by its own
failure (`guard`), leaving the others and SGLang running.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from sgl_blend import __version__, cpu_compat
from sgl_blend.core.kv_priority import ReuserIndex
from sgl_blend.core.policy_worker import make_link
from sgl_blend.core.prefill_room import prefill_room
from sgl_blend.core.psm_policy import PSMPolicy, make_offline_policy
from sgl_blend.offline import is_offline
from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.guard import SWITCHED_OFF, guarded, live, switch_off
from sgl_blend.sglang_plugin.iteration_log import IterationRecorder
from sgl_blend.sglang_plugin.load_report import LaunchedRequests
from sgl_blend.sglang_plugin.modes import make_mode
from sgl_blend.sglang_plugin.modes.base import free_kv_tokens
from sgl_blend.sglang_plugin.offline_pool import OfflinePool
from sgl_blend.sglang_plugin.plugin_time import PluginTime
from sgl_blend.sglang_plugin.prompt_check import PromptCheck
from sgl_blend.sglang_plugin.settings import PluginSettings

POOL_FAILED = "sgl-blend offline pool failed; falling back to SGLang's own scheduling"
RECORD_FAILED = "sgl-blend per-iteration record failed; recording stops"
LOAD_FAILED = "sgl-blend could not count the running requests; the load report is SGLang's own"


class PluginRuntime:
    def __init__(self, settings: PluginSettings) -> None:
        self.settings = settings
        self.mode = make_mode(settings.colocation)
        self.recorder: IterationRecorder | None = IterationRecorder(settings.iteration_log)
        self.pool: OfflinePool | None = None
        self._pool_tried = not settings.pool_enabled
        # Offline requests waiting outside SGLang's queue: the pool's, kept by the runtime so that a
        # pool switched off by a failure gives them back to SGLang.
        self.backlog: dict[str, Any] = {}
        self.mode.backlog = self.backlog
        self.prompt_check = PromptCheck()
        self.launched: LaunchedRequests | None = LaunchedRequests()
        self.time = PluginTime()

    def reusers(self) -> ReuserIndex | None:
        """The pool's pending-reuser counts, for the radix backend's Echo eviction."""
        return self.pool.reusers if self.pool is not None else None

    def reset_records(self) -> None:
        if self.recorder is not None:
            self.recorder = IterationRecorder(self.settings.iteration_log)

    def state(self) -> dict[str, Any]:
        """What the plugin reports about the process it runs in (``/server_info``'s
        ``internal_states[].sgl_blend``). ``dp_rank`` names the scheduler's DP rank (None
        without a DP controller): ``internal_states`` lists the ranks in the order they
        answered, not by rank."""
        return {
            "version": __version__,
            "pid": os.getpid(),
            "dp_rank": sgl.get_parallel().dp_rank,
            "cpu_kernel_stub": cpu_compat.kernel_stub_active(),
            "switched_off": list(SWITCHED_OFF),
            "offline": self.pool.snapshot() if self.pool is not None else None,
            "prompt_ids": self.prompt_check.snapshot(),
            "plugin_time": self.time.snapshot(),
            "colocation": None,
            "bros": None,
            **self.mode.snapshot(),
            **(self.recorder.snapshot() if self.recorder is not None else {}),
        }

    def _create_pool(self, tree_cache: Any) -> OfflinePool:
        settings = self.settings
        server_args = sgl.get_server_args()
        model = settings.priced_model(server_args.model_path)
        name = settings.offline_policy
        options = (
            {"utility": settings.psm_utility} if name == PSMPolicy.name and settings.psm_utility is not None else {}
        )
        # SGLang's overlap scheduler (its default) caches a forward's prefix two processed results
        # after its admission: held one result, DFS on the emulated H100 computed MMLU's few-shot
        # prefixes again (trace1, 4,000 lines: 0.35M cached prompt tokens; held two, 0.87-0.97M).
        options["batches_in_flight"] = 1 if server_args.disable_overlap_schedule else 2
        factory = functools.partial(make_offline_policy, name, model, settings.device(server_args.tp_size), **options)
        link = make_link(
            settings.policy_worker,
            factory,
            int(tree_cache.token_to_kv_pool_allocator.size),
            record_calls=settings.record_policy_calls,
        )
        reusers = ReuserIndex() if self.mode.kv_priorities else None
        return OfflinePool(link, name, self.backlog, reusers, record_calls=settings.record_policy_calls)

    def _ensure_pool(self, tree_cache: Any) -> None:
        """The pool is made on the scheduler's first use of it, once the KV pool's size is known."""
        if not self._pool_tried:
            self._pool_tried = True
            try:
                self.pool = self._create_pool(tree_cache)
            except Exception:
                switch_off(self, "pool", "sgl-blend could not create its offline pool; SGLang schedules on its own")

    def release_offline(self, scheduler: Any) -> None:
        """Before SGLang builds a prefill batch: its queue gets what the policy proposes now (and
        everything waiting in the backlog once the pool is off, so nothing is lost)."""
        self._ensure_pool(scheduler.tree_cache)
        if self.pool is not None:
            self._release(scheduler)
        if self.pool is None and self.backlog:
            scheduler.waiting_queue.extend(self.backlog.values())
            self.backlog.clear()

    @guarded("pool", POOL_FAILED)
    def _release(self, scheduler: Any) -> None:
        live(self.pool).release(scheduler.waiting_queue, free_kv_tokens(scheduler.tree_cache))

    def order_waiting_queue(self, waiting_queue: list, tree_cache: Any) -> None:
        """After SGLang's own ordering: online first, offline work in the policy's order, then the
        mode's say on it (Echo picks its admissions from that order)."""
        self._ensure_pool(tree_cache)
        self._order(waiting_queue)
        self.mode.order_offline(waiting_queue, tree_cache, self.reusers())

    @guarded("pool", POOL_FAILED)
    def _order(self, waiting_queue: list) -> None:
        live(self.pool).order_waiting_queue(waiting_queue)

    @guarded("pool", POOL_FAILED)
    def cap_prefill(self, adder: Any, chunk: int | None, decodes: int) -> None:
        """Apply the policy's per-iteration prefill budget (Alg. 3's ``C_L + C_R``) to SGLang's
        chunk, by the rule the simulator uses (`prefill_room`)."""
        budget = live(self.pool).prefill_budget()
        if chunk is not None and budget is not None and adder.rem_chunk_tokens > 0:
            adder.rem_chunk_tokens = prefill_room(chunk, decodes, budget)
            adder.rem_input_tokens = min(adder.rem_input_tokens, adder.rem_chunk_tokens)
        live(self.pool).prefill_cap = adder.rem_chunk_tokens

    def may_admit(self, req: Any) -> bool | None:
        """The mode's word first, then the pool's (None: nobody objects)."""
        planned = self.mode.may_admit(req)
        return planned if planned is not None else self._pool_may_admit(req)

    @guarded("pool", POOL_FAILED)
    def _pool_may_admit(self, req: Any) -> bool:
        return live(self.pool).may_admit(req)

    @guarded("pool", POOL_FAILED)
    def admitted(self, req: Any, tree_cache: Any) -> None:
        live(self.pool).on_admitted(req, tree_cache)

    @guarded("pool", POOL_FAILED)
    def prefill_continues(self, req: Any) -> None:
        live(self.pool).on_prefill_continues(req)

    def note_arrival(self, scheduler: Any, req: Any) -> None:
        """A request entered the waiting queue for the first time (not a retracted one coming
        back): an offline one moves to the pool's backlog."""
        if not is_offline(req.routing_key):
            self._record_arrival(scheduler, req)
        else:
            self.prompt_check.arrived(req)
            self._ensure_pool(scheduler.tree_cache)
            self._pool_arrival(scheduler, req)
        self.mode.note_arrival(scheduler, req)

    @guarded("pool", POOL_FAILED)
    def _pool_arrival(self, scheduler: Any, req: Any) -> None:
        live(self.pool).arrive(req, scheduler.waiting_queue)

    @guarded("pool", POOL_FAILED)
    def requeued(self, req: Any) -> None:
        """A running request went back to SGLang's queue (retracted, or parked by the mode)."""
        if is_offline(req.routing_key):
            live(self.pool).retracted(req)

    def before_prefill(self, scheduler: Any, running_batch: Any) -> Any:
        """The running batch SGLang builds its prefill next to: the mode may have put held decodes
        back into it, or given a new one for an empty one. First the queue gets the offline
        requests the policy proposes."""
        self.release_offline(scheduler)
        return self.mode.before_prefill(scheduler, running_batch) or running_batch

    def idle(self, sglang_idle: bool) -> bool:
        """SGLang finds nothing to do; it is not idle while the mode holds decodes or offline
        requests wait in the backlog."""
        idle = sglang_idle and not self.mode.holding() and not self.backlog
        if idle:
            self._record_idle()
        return idle

    def before_abort(self, scheduler: Any, recv_req: Any) -> list[str]:
        """Backlog requests ``recv_req`` names join SGLang's queue, where its abort finds them."""
        if self.pool is None:
            return []
        return self._before_abort(scheduler, recv_req) or []

    @guarded("pool", POOL_FAILED)
    def _before_abort(self, scheduler: Any, recv_req: Any) -> list[str]:
        return live(self.pool).before_abort(scheduler.waiting_queue, recv_req.rid, recv_req.abort_all)

    def aborted(self, scheduler: Any, recv_req: Any, matched: list[str]) -> None:
        """SGLang has aborted what it can see of ``recv_req``: the policy forgets the pending
        requests it took; held decodes are the mode's."""
        if matched:
            self._after_abort(scheduler, matched)
        self.mode.abort_held(scheduler, recv_req.rid, recv_req.abort_all, recv_req.finished_reason)

    @guarded("pool", POOL_FAILED)
    def _after_abort(self, scheduler: Any, matched: list[str]) -> None:
        live(self.pool).after_abort(scheduler.waiting_queue, matched)

    def before_decode(self, scheduler: Any, batch: Any) -> None:
        self.mode.before_decode(scheduler, batch)

    def end_iteration(self) -> None:
        self._record_plan(self.mode.end_iteration())

    def prefill_built_nothing(self) -> None:
        self._record_plan(self.mode.prefill_built_nothing())

    def begin_forward(self, scheduler: Any, batch: Any) -> None:
        self._note_launch(batch)
        self._record_begin(scheduler, batch, self.time.iteration_done())

    @guarded("launched", LOAD_FAILED)
    def _note_launch(self, batch: Any) -> None:
        live(self.launched).launched(batch)

    @guarded("launched", LOAD_FAILED)
    def running_requests(self, running_batch: Any) -> int | None:
        """What the load report should count as running (None: leave SGLang's count)."""
        return live(self.launched).running(running_batch)

    def forward_done(self, forward_s: float) -> None:
        self.mode.forward_done(self._record_forward(), forward_s)

    def batch_done(self, batch: Any) -> None:
        """SGLang has processed ``batch``'s result: progress and completions."""
        self._report_batch(batch.reqs)
        self.mode.observe_batch(batch)

    @guarded("pool", POOL_FAILED)
    def _report_batch(self, reqs: list) -> None:
        live(self.pool).on_batch_result(reqs)

    @guarded("recorder", RECORD_FAILED)
    def _record_arrival(self, scheduler: Any, req: Any) -> None:
        live(self.recorder).arrived(req.rid, int(scheduler.forward_ct))

    @guarded("recorder", RECORD_FAILED)
    def _record_idle(self) -> None:
        live(self.recorder).idle()

    @guarded("recorder", RECORD_FAILED)
    def _record_plan(self, summary: dict[str, Any] | None) -> None:
        live(self.recorder).plan_summary = summary or {}

    @guarded("recorder", RECORD_FAILED)
    def _record_begin(self, scheduler: Any, batch: Any, plugin_s: float) -> None:
        live(self.recorder).begin(batch, int(scheduler.forward_ct) + 1, plugin_s)

    @guarded("recorder", RECORD_FAILED)
    def _record_forward(self) -> dict[str, Any] | None:
        return live(self.recorder).forward_done()
