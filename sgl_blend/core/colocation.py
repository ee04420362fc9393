"""Online/offline co-location, decided once per scheduler iteration (HyGen Alg. 1-2, Echo §4-5).

The engine describes an iteration as an `IterationView` -- what is decoding, which online
requests wait, how much KV and chunk room there is -- and `ColocationController.begin` answers
with an `IterationPlan`:

1. Online work goes first and is never cut: every online decode and every waiting online prefill
   is charged to the iteration's budget before any offline work.
2. Offline decodes are kept, oldest first, while the predicted batch time stays within the
   latency budget; the rest are parked for this iteration (HyGen's decode skipping: the engine
   holds them out of the batch with their KV resident and puts them back without recompute).
3. The plan's `IterationBudget` then admits offline prefill chunks in the offline policy's order
   (`offline_chunk`), each the longest that fits the residual time, the chunk room and the
   offline memory, and only if the decode iteration that follows also stays within the budget.

In Echo mode steps 2 and 3 are Echo's selector (`echo_plan`): `begin` keeps the last batch's
offline decodes that the deadline carries, cheapest first, and preempts at the least punishment
what memory requires; `choose_offline` then picks, from the waiting offline requests the engine
shows it, which to admit and in what order by benefit minus punishment per unit of time, and the
engine admits exactly those, each chunk capped by the selection.

Memory is HyGen's offline budget (Alg. 2, `ColocationController.offline_memory`): online demand
is met first; what offline work no longer fits beside it gives back -- first the KV parked decodes
keep pinned (`IterationPlan.unpin_tokens`, newest parked first), then running offline requests
(`IterationPlan.preempt`: newest first in HyGen, at the least punishment in Echo) -- and offline
admission gets what is left.

The budget depends on what the online requests are doing (`state_budget`). HyGen's is the
predicted online-only iteration plus a headroom (``headroom_s``, what the SLO search finds),
capped by the TBT target while online requests decode and by the TTFT slack of a waiting one, and
the TTFT slack (``idle_budget_s``) when no online request is present -- or, without a headroom,
the paper's fixed per-iteration budget ``L``. Echo's is the tightest ``TTFT + i·TPOT - waited``
over the online requests capped by the TBT target, and the same idle cap when none is present.
Echo's online reserve (μ + kσ of recent online KV demand) caps how much KV offline work may hold,
so an online burst finds room without evicting offline KV.

No SGLang import: the SGLang plugin and the simulator build views and apply plans the same way.
"""

from __future__ import annotations

import copy
import json
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sgl_blend.core import echo_plan
from sgl_blend.core.echo_plan import EchoChoices, OfflineCandidate
from sgl_blend.core.host_gap import HostTime
from sgl_blend.core.iteration_budget import DEFAULT_MIN_OFFLINE_CHUNK, IterationBudget, RunningRequest, ScaledModel
from sgl_blend.core.latency_model import BatchShape, model_from_dict
from sgl_blend.core.state_budget import deadline_budget, echo_budget, hygen_budget

MODES = ("off", "hygen", "echo", "bros")
DEFAULT_CALIBRATION_ALPHA = 0.05
CALIBRATION_CLIP = (0.1, 10.0)


@dataclass(frozen=True)
class ColocationConfig:
    """How a server co-locates online and offline work; travels to the scheduler inside the
    plugin's settings (`sgl_blend.sglang_plugin.settings`).

    ``latency_budget_s`` is HyGen's fixed per-iteration budget (None: no time cap, memory only);
    ``headroom_s``, when set, replaces it with HyGen's budget by state (`state_budget`): the
    predicted online-only iteration plus this headroom, capped by ``tpot_slo_s`` (the TBT target)
    while online requests decode and by ``ttft_slo_s`` less the wait of a waiting online request.
    ``ttft_slo_s``/``tpot_slo_s`` are Echo's and BROS's deadlines, and ``idle_budget_s`` every
    mode's cap on an iteration no online request is in (the TTFT slack). ``latency_model`` is a
    fitted model's ``to_dict``.
    ``calibration_alpha`` weighs each measured batch in the running measured/predicted ratio
    that scales predictions (0 keeps the fitted model as it is).
    ``bros_tail_quantile``, when set, has BROS plan each iteration to that quantile of its
    measured periods instead of their mean (`core.bros.cost.PeriodTail`).
    """

    mode: str = "off"
    latency_budget_s: float | None = None
    headroom_s: float | None = None
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    idle_budget_s: float | None = None
    reserve_sigmas: float = 2.0
    reserve_window_s: float = 60.0
    min_offline_chunk: int = DEFAULT_MIN_OFFLINE_CHUNK
    calibration_alpha: float = DEFAULT_CALIBRATION_ALPHA
    bros_tail_quantile: float | None = None
    latency_model: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown co-location mode {self.mode!r}; known: {', '.join(MODES)}")
        for name in ("latency_budget_s", "headroom_s", "ttft_slo_s", "tpot_slo_s", "idle_budget_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"{name} must be a non-negative number of seconds or null, got {value!r}")
        if not (isinstance(self.min_offline_chunk, int) and self.min_offline_chunk >= 1):
            raise ValueError(f"min_offline_chunk must be a positive token count, got {self.min_offline_chunk!r}")
        if not (self.reserve_sigmas >= 0 and self.reserve_window_s > 0):
            raise ValueError("reserve_sigmas must be >= 0 and reserve_window_s > 0")
        if not 0 <= self.calibration_alpha <= 1:
            raise ValueError(f"calibration_alpha must be in [0, 1], got {self.calibration_alpha}")
        if self.bros_tail_quantile is not None and not 0 < self.bros_tail_quantile < 1:
            raise ValueError(f"bros_tail_quantile must be in (0, 1) or null, got {self.bros_tail_quantile!r}")
        if self.mode == "echo" and (self.ttft_slo_s is None or self.tpot_slo_s is None):
            raise ValueError("echo mode needs ttft_slo_s and tpot_slo_s (its per-token deadlines)")
        if self.needs_model() and self.latency_model is None:
            raise ValueError("a latency budget needs a fitted latency model (sgl-blend profile --latency)")
        if self.latency_model is not None:
            model_from_dict(self.latency_model)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def kv_priorities(self) -> bool:
        return self.mode == "echo"

    @property
    def online_reserve(self) -> bool:
        return self.mode == "echo"

    def needs_model(self) -> bool:
        return self.latency_budget_s is not None or self.headroom_s is not None or self.mode in ("echo", "bros")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ColocationConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown co-location settings: {', '.join(sorted(unknown))}")
        return cls(**data)

    def updated(self, changes: dict[str, Any]) -> ColocationConfig:
        return ColocationConfig.from_dict({**asdict(self), **changes})


@dataclass(frozen=True, slots=True)
class WaitingOnline:
    """An online request waiting for its (first or next) prefill chunk."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    arrival: float


@dataclass
class IterationView:
    """``parked_tokens`` is the KV that parked offline decodes keep pinned for their return."""

    now: float
    running: Sequence[RunningRequest]
    waiting_online: Sequence[WaitingOnline]
    kv_capacity: int
    chunk_tokens: int | None = None
    parked_tokens: int = 0


class OnlineDemandWindow:
    """μ + kσ of online KV demand over a sliding time window (Echo §5.3), with O(1) updates."""

    def __init__(self, window_s: float, sigmas: float) -> None:
        self.window_s = window_s
        self.sigmas = sigmas
        self._samples: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self._sum_sq = 0.0

    def observe(self, now: float, tokens: float) -> None:
        self._samples.append((now, tokens))
        self._sum += tokens
        self._sum_sq += tokens * tokens
        while self._samples and self._samples[0][0] < now - self.window_s:
            _, old = self._samples.popleft()
            self._sum -= old
            self._sum_sq -= old * old

    def reserve(self) -> int:
        count = len(self._samples)
        if not count:
            return 0
        mean = self._sum / count
        variance = max(self._sum_sq / count - mean * mean, 0.0)
        return int(math.ceil(mean + self.sigmas * math.sqrt(variance)))


@dataclass
class IterationPlan:
    """``echo`` holds Echo's selector decisions (None in HyGen mode)."""

    budget: IterationBudget
    park: list[str] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    unpin_tokens: int = 0
    online_reserve: int = 0
    calibration: float = 1.0
    echo: EchoChoices | None = None

    def summary(self) -> dict[str, Any]:
        predicted, raw = self.budget.predicted_s(), self.budget.model_s()
        return {
            "latency_budget_s": self.budget.latency_s,
            "predicted_s": round(predicted, 6) if predicted is not None else None,
            "model_s": round(raw, 6) if raw is not None else None,
            "parked": len(self.park),
            "preempted": len(self.preempt),
            "unpinned_tokens": self.unpin_tokens,
            "online_reserve": self.online_reserve,
            "calibration": round(self.calibration, 4),
            **({"echo": self.echo.summary()} if self.echo is not None else {}),
        }


def online_shape(running: Sequence[RunningRequest], waiting: Sequence[WaitingOnline]) -> BatchShape:
    """The online part of an iteration: every online decode and every waiting online prompt."""
    shape = BatchShape()
    for request in running:
        if request.online:
            shape = shape.with_decode(request.context)
    for prompt in waiting:
        shape = shape.with_prefill(prompt.prompt_tokens)
    return shape


class ColocationController:
    """The long-lived part: configuration, latency model and the online-demand window."""

    def __init__(self, config: ColocationConfig) -> None:
        self.config = config
        self.model = model_from_dict(config.latency_model) if config.latency_model else None
        self.demand = OnlineDemandWindow(config.reserve_window_s, config.reserve_sigmas)
        self.calibration = 1.0
        self.host = HostTime()

    def observe_host(self, requests: int, gap_s: float) -> None:
        """The host's gap after a batch of ``requests`` (`core.host_gap`)."""
        self.host.observe(requests, gap_s)

    def observe(self, model_s: float | None, measured_s: float | None, requests: int) -> None:
        """Fold one batch's measured time into the calibration (EWMA of measured/predicted), unless
        the host bounded it (its predicted time for the batch's ``requests`` at least the scaled
        forward's). Such a period is the host's and says nothing of the device: folded in, it made
        a fixed host cost look like a slow device, and the smaller batch the higher calibration then
        admitted took the host just as long. On the emulated H100 over the 2-core host, Echo's
        periods stayed at 11-11.5 ms (median) whether its batches carried 0-15 offline decodes or
        45-60, while the priced forward went from 5.2 to 10.7 ms, and its calibration, 1.1 in the
        latter, reached 2.4 in the former and held Echo there (docs/colocation-history.md,
        "Echo's calibration and the host")."""
        if not model_s or not measured_s or model_s <= 0 or measured_s <= 0:
            return
        if self.host.seconds(requests) >= model_s * self.calibration:
            return
        ratio = min(max(measured_s / model_s, CALIBRATION_CLIP[0]), CALIBRATION_CLIP[1])
        alpha = self.config.calibration_alpha
        self.calibration = (1 - alpha) * self.calibration + alpha * ratio

    def scaled_model(self) -> ScaledModel | None:
        """The fitted model as the engine runs now: its calibration and the host's time."""
        return ScaledModel(self.model, self.calibration, self.host) if self.model is not None else None

    def reconfigure(self, changes: dict[str, Any]) -> None:
        """Apply runtime changes (the SLO profiler moves the budget on a live server)."""
        config = self.config.updated(changes)
        self.config = config
        self.model = model_from_dict(config.latency_model) if config.latency_model else None
        self.demand.window_s, self.demand.sigmas = config.reserve_window_s, config.reserve_sigmas

    def latency_budget(self, view: IterationView, model: ScaledModel | None) -> float | None:
        """This iteration's budget from the online requests' state (`state_budget`). Echo and a
        HyGen headroom need a latency model (`ColocationConfig.needs_model`), so ``model`` is set
        wherever it is read."""
        config = self.config
        if config.mode != "echo" and config.headroom_s is None:
            return config.latency_budget_s
        assert model is not None, "ColocationConfig requires a latency model for echo and a headroom"
        online_s = model.predict(online_shape(view.running, view.waiting_online))
        decoding = any(request.online for request in view.running)
        if config.mode == "echo":
            ttft_s, tpot_s = config.ttft_slo_s, config.tpot_slo_s
            assert ttft_s is not None and tpot_s is not None, "ColocationConfig requires both in echo mode"
            slack = deadline_budget(view.now, view.running, view.waiting_online, ttft_s, tpot_s, config.idle_budget_s)
            if not (decoding or view.waiting_online):
                return slack
            assert slack is not None, "an online request present always has a slack"
            return echo_budget(slack, online_s, tpot_s)
        headroom_s = config.headroom_s
        assert headroom_s is not None, "only echo or a headroom comes this far"
        return hygen_budget(
            view.now,
            online_s,
            decoding,
            view.waiting_online,
            headroom_s,
            config.tpot_slo_s,
            config.ttft_slo_s,
            config.idle_budget_s,
        )

    def offline_memory(self, view: IterationView) -> tuple[int, int, int]:
        """The KV offline work may still take this iteration, the online reserve behind it, and
        the deficit online demand leaves (tokens offline work must give back now).

        HyGen's Alg. 2: online demand is met first from free memory plus what offline work holds
        (``m = free + M_off``); if that leaves less than ``M_off``, offline work is preempted until
        it fits, and offline admission gets ``m - M_off``. Echo keeps an extra reserve for online
        bursts (μ + kσ of recent online demand) out of offline reach; it caps admission but never
        preempts on its own. Offline KV counts what it holds now plus what its decodes may still add,
        and the KV parked offline decodes keep pinned.
        """
        online_kv = sum(r.context + r.reserved for r in view.running if r.online)
        online_kv += sum(w.prompt_tokens + w.max_new_tokens for w in view.waiting_online)
        offline_kv = sum(r.context + r.reserved for r in view.running if not r.online) + view.parked_tokens
        reserve = 0
        if self.config.online_reserve:
            self.demand.observe(view.now, online_kv)
            reserve = self.demand.reserve()
        deficit = max(online_kv + offline_kv - view.kv_capacity, 0)
        return view.kv_capacity - max(reserve, online_kv) - offline_kv, reserve, deficit

    def begin(self, view: IterationView) -> IterationPlan:
        offline_memory, reserve, deficit = self.offline_memory(view)
        model = self.scaled_model()
        latency_s = self.latency_budget(view, model)
        budget = IterationBudget(model, latency_s, view.chunk_tokens, offline_memory, self.config.min_offline_chunk)
        for request in view.running:
            if request.online:
                budget.add_online_decode(request.context)
        for waiting in view.waiting_online:
            budget.add_online_prefill(waiting.prompt_tokens)
        plan = IterationPlan(budget, online_reserve=reserve, calibration=self.calibration)
        plan.unpin_tokens = min(deficit, view.parked_tokens)
        deficit -= plan.unpin_tokens
        budget.free_offline_memory(plan.unpin_tokens)
        offline = [request for request in view.running if not request.online]
        if self.config.mode == "echo":
            self._echo_running(plan, offline, deficit)
            return plan
        while deficit > 0 and offline:
            preempted = offline.pop()
            plan.preempt.append(preempted.rid)
            deficit -= preempted.context + preempted.reserved
            budget.free_offline_memory(preempted.context + preempted.reserved)
        for position, request in enumerate(offline):
            if not budget.try_offline_decode(request.context):
                plan.park = [parked.rid for parked in offline[position:]]
                break
        return plan

    def _echo_running(self, plan: IterationPlan, offline: list[RunningRequest], deficit: int) -> None:
        """Echo's adjustments to the last batch's offline decodes (`echo_plan`): preempt at the
        least punishment what memory requires, then keep the cheapest decodes the deadline carries."""
        budget = plan.budget
        preempted = echo_plan.preempt_for_memory(offline, deficit)
        plan.preempt = [adjustment.rid for adjustment in preempted]
        gone = set(plan.preempt)
        budget.free_offline_memory(sum(r.context + r.reserved for r in offline if r.rid in gone))
        decodes = echo_plan.keep_decodes(budget, [r for r in offline if r.rid not in gone])
        plan.park = [adjustment.rid for adjustment in decodes if adjustment.kind == echo_plan.PARK_DECODE]
        plan.echo = echo_plan.EchoChoices(preempted + decodes, predicted_s=budget.predicted_s())

    def choose_offline(
        self,
        plan: IterationPlan,
        candidates: Sequence[OfflineCandidate],
        *,
        continuing: tuple[int, int, int] | None = None,
        truncate: bool = True,
        window: int = echo_plan.CANDIDATE_WINDOW,
    ) -> dict[str, int]:
        """Echo's prefill selection for ``plan`` (made by `begin` in echo mode): which waiting
        offline requests to admit, in which order, with which chunk (rid to chunk). It is chosen on
        a copy of the plan's budget, so the engine still charges the real one as it admits;
        ``continuing`` -- ``(extend, prefix, max_new_tokens)`` of an offline chunked prefill under
        way, which goes first and cannot pause -- is charged on that copy the way the engine will.
        ``truncate`` says whether the engine may start a chunked prefill now; ``window`` how many
        candidates, from the first, the selector weighs. A request this plan has just preempted or
        parked does not come back in the same iteration."""
        choices = plan.echo
        assert choices is not None, "begin sets plan.echo in echo mode, the only mode that calls this"
        taken_out = {*plan.preempt, *plan.park}
        candidates = [candidate for candidate in candidates if candidate.rid not in taken_out]
        scratch = copy.copy(plan.budget)
        if continuing is not None:
            extend, prefix, max_new = continuing
            chunk = scratch.offline_chunk(extend, prefix, max_new, must_progress=True)
            scratch.commit_offline_prefill(chunk, prefix, chunk >= extend, max_new)
        model = scratch.model or self.scaled_model()
        added = echo_plan.add_prefills(scratch, model, candidates, truncate=truncate, window=window)
        choices.adjustments.extend(added)
        choices.candidates = min(len(candidates), window)
        choices.admit = {adjustment.rid: adjustment.tokens for adjustment in added}
        choices.predicted_s = scratch.predicted_s()
        return choices.admit
