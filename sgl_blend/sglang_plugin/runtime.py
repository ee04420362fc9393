"""Everything the plugin keeps in one SGLang process, in one object that `register` creates.

SGLang's hooks are plain functions patched into its classes, so whatever they share must live
somewhere they can all reach. It lives here, created once per process from the launcher's
`PluginSettings` and handed to every hook, to the prefill adder and to the radix backend: the
offline pool (created on the scheduler's first ordering, when the KV pool's size is known), the
per-iteration record, and the one scheduling mode (`modes`). Each part is switched off by its own
failure (`guard`), leaving the others and SGLang running.
"""

from __future__ import annotations

import os
from typing import Any

from sgl_blend import __version__, cpu_compat
from sgl_blend.core.kv_priority import ReuserIndex
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
        self.prompt_check = PromptCheck()
        self.launched: LaunchedRequests | None = LaunchedRequests()

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
        reusers = ReuserIndex() if self.mode.kv_priorities else None
        return OfflinePool(
            make_offline_policy(name, model, settings.device(server_args.tp_size), **options),
            name,
            int(tree_cache.token_to_kv_pool_allocator.size),
            reusers,
            record_calls=settings.record_policy_calls,
        )

    def order_waiting_queue(self, waiting_queue: list, tree_cache: Any) -> None:
        """After SGLang's own ordering: online first, offline work in the policy's order, then the
        mode's say on it (Echo picks its admissions from that order)."""
        if not self._pool_tried:
            self._pool_tried = True
            try:
                self.pool = self._create_pool(tree_cache)
            except Exception:
                switch_off(self, "pool", "sgl-blend could not create its offline pool; SGLang schedules on its own")
        self._order(waiting_queue, tree_cache)
        self.mode.order_offline(waiting_queue, tree_cache, self.reusers())

    @guarded("pool", POOL_FAILED)
    def _order(self, waiting_queue: list, tree_cache: Any) -> None:
        live(self.pool).order_waiting_queue(waiting_queue, free_kv_tokens(tree_cache))

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
        """A request entered the waiting queue for the first time (not a retracted one coming back)."""
        if not is_offline(req.routing_key):
            self._record_arrival(scheduler, req)
        else:
            self.prompt_check.arrived(req)
        self.mode.note_arrival(scheduler, req)

    def before_prefill(self, scheduler: Any, running_batch: Any) -> Any:
        """The running batch SGLang builds its prefill next to: the mode may have put held decodes
        back into it, or given a new one for an empty one."""
        return self.mode.before_prefill(scheduler, running_batch) or running_batch

    def idle(self, sglang_idle: bool) -> bool:
        """SGLang finds nothing to do; it is not idle while the mode holds decodes."""
        idle = sglang_idle and not self.mode.holding()
        if idle:
            self._record_idle()
        return idle

    def aborted(self, scheduler: Any, recv_req: Any) -> None:
        """SGLang has aborted what it can see of ``recv_req``; held decodes are the mode's."""
        self.mode.abort_held(scheduler, recv_req.rid, recv_req.abort_all, recv_req.finished_reason)

    def before_decode(self, scheduler: Any, batch: Any) -> None:
        self.mode.before_decode(scheduler, batch)

    def end_iteration(self) -> None:
        self._record_plan(self.mode.end_iteration())

    def prefill_built_nothing(self) -> None:
        self._record_plan(self.mode.prefill_built_nothing())

    def begin_forward(self, scheduler: Any, batch: Any) -> None:
        self._note_launch(batch)
        self._record_begin(scheduler, batch)

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
    def _record_begin(self, scheduler: Any, batch: Any) -> None:
        live(self.recorder).begin(batch, int(scheduler.forward_ct) + 1)

    @guarded("recorder", RECORD_FAILED)
    def _record_forward(self) -> dict[str, Any] | None:
        return live(self.recorder).forward_done()
