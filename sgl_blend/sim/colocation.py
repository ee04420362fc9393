"""Online arrivals and an offline pool on one simulated engine, planned by the core co-location code.

Every iteration the engine describes itself as the SGLang plugin does -- an `IterationView` of
what decodes and which online requests wait -- and applies the `ColocationController`'s plan with
the same budget calls the plugin makes (`offline_chunk`, `commit_offline_prefill`): online
decodes and online prefill chunks first, offline decodes the plan parks skip the iteration,
offline prefill chunks in the offline policy's order fill what the budget, the chunk room and the
KV leave. The iteration then takes what its clock measures for the batch that really ran
(`NoisyClock`, or `sim.host.HostBoundClock` for a host that falls behind the device), and the
controller's calibration learns from that measurement, as it does from SGLang's periods; its host
time learns from the gaps a host-bound clock reports to `ColocationController.observe_host`, as
the plugin's does from the iteration records.

Configurations are the same loop with different settings, so they differ only where they say:

- ``offline`` empty: online-only serving, the SLO reference;
- no latency budget: online first and offline fills every iteration (SGLang's priority scheduling
  with mixed chunks; give it SGLang's own offline order, ``lpm``);
- ``offline_rate``: offline requests are released to the pool at that rate (HyGen's HyGen*);
- ``batch_window``: offline requests are released in file order through the Batch API's window
  for a co-locating engine (`server.window.colocated_window`): what the engine runs (not what it
  parks) plus as many again, at least `QUEUE_FLOOR`, resized every `QUEUE_LOOK_S` -- the emulated
  judge's feed;
- a latency budget (HyGen) or Echo's deadlines: the co-location planner. In Echo mode the
  controller's selector picks the offline admissions (`ColocationController.choose_offline`) from
  the policy's first proposals, as it does in the plugin from the ordered waiting queue, and they
  are admitted in its order with its chunks; the plan's Echo decisions are counted (``echo_*``).

Memory: shared prompt segments live in the radix cache (`RadixKVCache`); a parked offline decode
keeps its KV in place (the plugin checkpoints it into the radix cache, which the sim does not
evict from); when KV runs out, offline requests are retracted newest first and recompute their
prompt and output when they return -- online work never waits for offline memory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from sgl_blend.core.colocation import (
    ColocationController,
    IterationBudget,
    IterationPlan,
    IterationView,
    RunningRequest,
    WaitingOnline,
)
from sgl_blend.core.cost_model import CLIP_MAX_NEW_TOKENS, MIN_NEW_TOKEN_RATIO
from sgl_blend.core.echo_plan import CANDIDATE_WINDOW, OfflineCandidate
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.core.protocol import AdmissionPolicy, OfflineRequest
from sgl_blend.core.request_timing import RequestTiming
from sgl_blend.forward_time.step_time import IterationClock
from sgl_blend.server.window import QUEUE_LOOK_S, RankLoad, colocated_window
from sgl_blend.sim.feed import runner_window
from sgl_blend.sim.kv_cache import RadixKVCache
from sgl_blend.sim.workload import SimRequest

PROGRESS_INTERVAL = 32


@dataclass(frozen=True)
class OnlineArrival:
    at: float
    request: SimRequest


@dataclass(frozen=True)
class ColocatedConfig:
    """``chunk_tokens`` is the per-iteration token budget (Sarathi's chunk, SGLang's
    ``--chunked-prefill-size``); ``offline_rate`` None puts the whole pool in at time 0.
    ``mixed`` False is SGLang without ``--enable-mixed-chunk``: an iteration that prefills
    anything decodes nothing, and prefill goes first whenever a prompt fits. ``echo_window`` is how
    many of the policy's proposals Echo's selector weighs (`echo_plan.CANDIDATE_WINDOW`).
    ``batch_window`` feeds offline requests as the Batch API feeds a co-locating engine."""

    kv_capacity: int
    chunk_tokens: int = 512
    max_running: int = 256
    offline_rate: float | None = None
    mixed: bool = True
    proposal_size: int = 8
    echo_window: int = CANDIDATE_WINDOW
    batch_window: bool = False


@dataclass
class ColocatedResult:
    """Online timings (one per arrival, in arrival order), offline tokens as ``(time, tokens)``
    events (prompts and outputs; ``offline_output_events`` the outputs alone), and what the
    planner did."""

    horizon_s: float
    seconds: float
    online: list[RequestTiming]
    offline_events: list[tuple[float, int]]
    iterations: int
    peak_kv: int
    counts: dict[str, int] = field(default_factory=dict)
    offline_output_events: list[tuple[float, int]] = field(default_factory=list)

    def offline_tokens_per_s(self) -> float:
        """Offline prompt tokens (once, when a request's prompt is done) and output tokens
        produced before the online trace ends, per second of it; recomputation does not count."""
        return self._per_s(self.offline_events)

    def offline_output_tokens_per_s(self, since_s: float = 0.0) -> float:
        """Offline output tokens alone, as the Batch API's usage counts them (the emulated judge's
        measure), from ``since_s``: an online trace that started after the batch did is judged
        on its own window."""
        return self._per_s(self.offline_output_events, since_s)

    def _per_s(self, events: list[tuple[float, int]], since_s: float = 0.0) -> float:
        tokens = sum(count for at, count in events if since_s < at <= self.horizon_s)
        window = self.horizon_s - since_s
        return tokens / window if window > 0 else 0.0


class _Active:
    """A request the engine has seen: its KV (``private`` tokens beyond shared segments), prefill
    progress and output so far. A retracted offline request keeps its output and its record."""

    __slots__ = (
        "request",
        "rid",
        "prompt_len",
        "online",
        "arrival",
        "prefill_left",
        "generated",
        "private",
        "timing",
        "last_token",
        "prompt_counted",
    )

    def __init__(self, request: SimRequest, online: bool, arrival: float, timing: RequestTiming | None) -> None:
        self.request = request
        self.rid = request.rid
        self.prompt_len = request.prompt_len
        self.online = online
        self.arrival = arrival
        self.prefill_left = 0
        self.generated = 0
        self.private = 0
        self.timing = timing
        self.last_token = arrival
        self.prompt_counted = False

    @property
    def context(self) -> int:
        return self.prompt_len + self.generated - self.prefill_left

    def reserve(self) -> int:
        return min(self.request.max_new_tokens - self.generated, CLIP_MAX_NEW_TOKENS)

    def admission_reserve(self) -> float:
        """The decode room SGLang's admission reserves for this request."""
        return self.reserve() * (1.0 if self.request.exact else MIN_NEW_TOKEN_RATIO)


def still_chunked(chunks: Sequence[tuple[_Active, int]]) -> bool:
    """Whether a prompt of this iteration's ``chunks`` stays unfinished. SGLang holds one chunked
    request at a time, so beside one that continues the plugin's adder admits nothing more
    (`after_chunked` takes its chunk room); once it completes, a new prompt may be cut.
    Forbidding any cut while a prompt had been under way, completing or not, admitted fewer
    offline prompts than the engine: HyGen at a 17.45 ms budget (30% load) kept 71 offline decodes
    a batch where the emulated engine kept 89 (docs/colocation-history.md, "The simulator's
    chunk rule")."""
    return any(chunk < active.prefill_left for active, chunk in chunks)


class ColocatedEngine:
    def __init__(
        self,
        clock: IterationClock,
        controller: ColocationController,
        policy: AdmissionPolicy | None,
        config: ColocatedConfig,
    ) -> None:
        self.clock = clock
        self.controller = controller
        self.policy = policy
        self.config = config

    def run(self, online: Sequence[OnlineArrival], offline: Sequence[SimRequest], horizon_s: float) -> ColocatedResult:
        """Serve until every online request is done and ``horizon_s`` has passed."""
        if offline and self.policy is None:
            raise ValueError("offline requests need an offline policy to order them")
        return _ColocatedRun(self, online, offline, horizon_s).execute()


class _ColocatedRun:
    def __init__(
        self, engine: ColocatedEngine, online: Sequence[OnlineArrival], offline: Sequence[SimRequest], horizon_s: float
    ) -> None:
        self.engine = engine
        self.cfg = engine.config
        self.controller = engine.controller
        self.policy = engine.policy
        self.arrivals = sorted(online, key=lambda arrival: arrival.at)
        self.timings = [RequestTiming(arrival.at) for arrival in self.arrivals]
        self.offline_order = list(offline)
        self.offline: dict[str, _Active] = {r.rid: _Active(r, False, 0.0, None) for r in offline}
        self.released = 0
        # The Batch API's window (``batch_window``): the runner's full one, its size now, and when
        # it is next resized.
        self.full_window = runner_window(self.offline_order, self.cfg, self.cfg.kv_capacity)
        self.window = 0
        self.next_look = 0.0
        # Offline decodes the last iteration parked: SGLang's report counts them neither running nor waiting.
        self.parked_now = 0
        self.horizon_s = horizon_s
        self.cache = RadixKVCache()
        self.private_used = 0
        self.now = 0.0
        self.next_arrival = 0
        self.waiting_online: list[_Active] = []
        self.running: list[_Active] = []
        self.online_left = len(self.arrivals)
        self.events: list[tuple[float, int]] = []
        self.output_events: list[tuple[float, int]] = []
        self.iterations = 0
        self.peak_kv = 0
        self.counts = {
            "parked": 0,
            "retracted": 0,
            "offline_finished": 0,
            "offline_prefill_computed": 0,
            "offline_prefix_hit": 0,
        }
        self.started: set[str] = set()

    @property
    def _offline_policy(self) -> AdmissionPolicy:
        """The policy, where only offline requests lead: `ColocatedEngine.run` refuses offline
        requests without one."""
        assert self.policy is not None, "offline requests come with an offline policy"
        return self.policy

    def execute(self) -> ColocatedResult:
        if self.policy is not None:
            self.policy.set_kv_capacity(self.cfg.kv_capacity)
        while self.online_left or self.now < self.horizon_s:
            self._take_arrivals()
            self._release_offline()
            if not self._step():
                self._idle_until_next_event()
        return ColocatedResult(
            self.horizon_s,
            self.now,
            self.timings,
            self.events,
            self.iterations,
            self.peak_kv,
            self.counts,
            self.output_events,
        )

    # -- arrivals ----------------------------------------------------------------------------

    def _release_offline(self) -> None:
        if self.policy is None:
            return
        rate = self.cfg.offline_rate
        due = len(self.offline_order) if rate is None else min(len(self.offline_order), int(self.now * rate) + 1)
        if self.cfg.batch_window:
            due = min(due, self._window_due())
        if due > self.released:
            self.policy.submit(
                OfflineRequest(r.rid, r.prompt_ids(), r.max_new_tokens, r.exact)
                for r in self.offline_order[self.released : due]
            )
            self.released = due

    def _window_due(self) -> int:
        """Released offline requests the Batch API's window allows: those finished, and the window
        resized at each look from what waits and what runs (admitted, prefilling or decoding, online
        too; not parked), as SGLang's load report says."""
        finished = self.counts["offline_finished"]
        if self.now >= self.next_look:
            admitted = sum(1 for active in self.running if not active.online)
            inflight = self.released - finished
            load = RankLoad(waiting=inflight - admitted, running=len(self.running) - self.parked_now)
            self.window = colocated_window(self.full_window, inflight, load)
            self.next_look = self.now + QUEUE_LOOK_S
        return finished + self.window

    def _take_arrivals(self) -> None:
        while self.next_arrival < len(self.arrivals) and self.arrivals[self.next_arrival].at <= self.now:
            arrival = self.arrivals[self.next_arrival]
            timing = self.timings[self.next_arrival]
            timing.received = self.now - arrival.at
            self.waiting_online.append(_Active(arrival.request, True, arrival.at, timing))
            self.next_arrival += 1

    def _idle_until_next_event(self) -> None:
        upcoming = [self.horizon_s]
        if self.next_arrival < len(self.arrivals):
            upcoming.append(self.arrivals[self.next_arrival].at)
        rate = self.cfg.offline_rate
        if rate is not None and self.released < len(self.offline_order):
            upcoming.append(self.released / rate)
        if self.cfg.batch_window and self.released < len(self.offline_order):
            upcoming.append(self.next_look)
        later = [at for at in upcoming if at > self.now]
        if not later:
            raise RuntimeError("the engine is idle with online requests left: one cannot fit in KV")
        self.now = min(later)

    # -- memory ------------------------------------------------------------------------------

    def _free(self) -> int:
        return self.cfg.kv_capacity - self.cache.used - self.private_used

    def _make_room(self, tokens: int, keep: _Active | None = None) -> bool:
        """Free ``tokens`` of KV: cached segments nobody uses first, then offline requests, the
        newest first (online work never waits for offline memory)."""
        short = tokens - self._free()
        if short > 0:
            self.cache.evict(short)
        while self._free() < tokens:
            victims = [a for a in self.running if not a.online and a is not keep]
            if not victims:
                return False
            self._retract(victims[-1])
            self.cache.evict(tokens - self._free())
        return True

    def _retract(self, active: _Active) -> None:
        self._release(active)
        active.prefill_left = 0
        self.counts["retracted"] += 1
        self._offline_policy.preempted(active.rid)

    def _release(self, active: _Active) -> None:
        self.cache.release(active.request.prefix)
        self.private_used -= active.private
        active.private = 0
        self.running.remove(active)

    def _start(self, active: _Active) -> int:
        """Allocate ``active``'s KV and put it in the running set; returns the tokens to prefill
        (0: it does not fit even after reclaiming offline KV, and nothing changed)."""
        request = active.request
        private = request.unique_len + active.generated
        if not self._make_room(self.cache.missing_tokens(request.prefix) + private):
            return 0
        hit = self.cache.acquire(request.prefix)
        if not active.online:
            self.started.add(active.rid)
            self.counts["offline_prefix_hit"] += hit
        active.private = private
        self.private_used += private
        active.prefill_left = max(1, request.prompt_len + active.generated - hit)
        self.running.append(active)
        return active.prefill_left

    # -- one iteration -----------------------------------------------------------------------

    def _view(self, decoding: list[_Active]) -> IterationView:
        holders = (
            Counter(key for a in self.running for key, _length in a.request.prefix)
            if self.controller.config.mode == "echo"
            else None
        )
        running = [
            RunningRequest(
                a.rid,
                a.online,
                a.context,
                a.reserve(),
                a.arrival,
                a.generated,
                self._shared_with_others(a, holders) if holders is not None and not a.online else 0,
            )
            for a in decoding
        ]
        waiting = [
            WaitingOnline(a.rid, a.prefill_left, a.reserve(), a.arrival)
            for a in self.running
            if a.online and a.prefill_left
        ]
        waiting += [
            WaitingOnline(a.rid, a.prompt_len - self.cache.cached_prefix(a.request.prefix), a.reserve(), a.arrival)
            for a in self.waiting_online
        ]
        return IterationView(self.now, running, waiting, self.cfg.kv_capacity, self.cfg.chunk_tokens)

    @staticmethod
    def _shared_with_others(active: _Active, holders: Counter[str]) -> int:
        """Prefix tokens another running request also uses: they stay resident if ``active`` goes."""
        shared = 0
        for key, length in active.request.prefix:
            if holders[key] < 2:
                break
            shared += length
        return shared

    def _step(self) -> bool:
        if not self._make_room(len(self.running)):
            raise RuntimeError("KV capacity cannot hold the online requests' next tokens")
        decoding = [a for a in self.running if not a.prefill_left]
        plan = self.controller.begin(self._view(decoding))
        preempted = set(plan.preempt)
        for active in [a for a in decoding if a.rid in preempted]:
            self._retract(active)
        decoding = [a for a in decoding if a.rid not in preempted]
        parked = set(plan.park)
        self.counts["parked"] += len(parked)
        self.parked_now = len(parked)
        decoding = [a for a in decoding if a.rid not in parked]
        chunks: list[tuple[_Active, int]] = []
        room = self._online_prefill(self.cfg.chunk_tokens - (len(decoding) if self.cfg.mixed else 0), chunks)
        if self.policy is not None and plan.echo is not None:
            self._echo_prefill(plan, room, chunks)
        elif self.policy is not None:
            self._offline_prefill(plan.budget, room, chunks)
        if plan.echo is not None:
            for kind, count in plan.echo.counts().items():
                self.counts[f"echo_{kind}"] = self.counts.get(f"echo_{kind}", 0) + count
        if chunks and not self.cfg.mixed:
            decoding = []
        shape = BatchShape()
        for active in decoding:
            shape = shape.with_decode(active.context)
        for active, chunk in chunks:
            shape = shape.with_prefill(chunk, active.context)
        if shape.is_empty():
            return False
        seconds = self.engine.clock.measure(shape)
        if self.controller.model is not None:
            self.controller.observe(self.controller.model.predict(shape), seconds, shape.requests)
        self.now += seconds
        self.iterations += 1
        self.cache.advance(1)
        offline_tokens = offline_outputs = 0
        for active in decoding:
            offline_tokens += self._emit_token(active)
            offline_outputs += not active.online
        for active, chunk in chunks:
            active.prefill_left -= chunk
            if not active.prefill_left:
                offline_tokens += self._emit_token(active)
                offline_outputs += not active.online
        if offline_tokens:
            self.events.append((self.now, offline_tokens))
            self.output_events.append((self.now, offline_outputs))
        self.peak_kv = max(self.peak_kv, self.cache.used + self.private_used)
        if self.policy is not None:
            self.policy.advance(1)
        return True

    def _online_prefill(self, room: int, chunks: list[tuple[_Active, int]]) -> int:
        """Online prompts first, in arrival order: those under way, then new ones while they fit."""
        for active in [a for a in self.running if a.online and a.prefill_left]:
            if room <= 0:
                return room
            chunk = min(active.prefill_left, room)
            chunks.append((active, chunk))
            room -= chunk
        while self.waiting_online and room > 0:
            active = self.waiting_online[0]
            if len(self.running) >= self.cfg.max_running and not self._free_slot():
                break
            if not self._start(active):
                break
            self.waiting_online.pop(0)
            chunk = min(active.prefill_left, room)
            chunks.append((active, chunk))
            room -= chunk
        return room

    def _free_slot(self) -> bool:
        """An online request short of a request slot takes one from offline work, newest first
        (the plugin's ``slots_reclaimed``)."""
        victims = [a for a in self.running if not a.online]
        if not victims:
            return False
        self._retract(victims[-1])
        self.counts["slots_reclaimed"] = self.counts.get("slots_reclaimed", 0) + 1
        return True

    def _offline_prefill(self, budget: IterationBudget, room: int, chunks: list[tuple[_Active, int]]) -> None:
        """Offline prompts under way, then new ones in the policy's order, each chunk what the
        plan's budget allows (`IterationBudget.offline_chunk`, as the plugin asks it)."""
        for active in [a for a in self.running if not a.online and a.prefill_left]:
            room = self._offline_chunk(budget, active, room, chunks, must_progress=True)
        if room <= 0 or still_chunked(chunks) or len(self.running) >= self.cfg.max_running:
            return
        reserved = sum(a.admission_reserve() for a in self.running)
        while room > 0 and len(self.running) < self.cfg.max_running:
            free = self._free() + self.cache.evictable - reserved
            proposal = self._offline_policy.propose(
                max(int(free), 0), min(self.cfg.proposal_size, self.cfg.max_running - len(self.running))
            )
            taken = []
            for offered in proposal:
                active = self.offline[offered.rid]
                extend = active.prompt_len - self.cache.cached_prefix(active.request.prefix) + active.generated
                allowed = budget.offline_chunk(extend, active.prompt_len + active.generated - extend, active.reserve())
                cut = min(allowed, room) < extend
                if room <= 0 or extend + active.reserve() > free or not allowed:
                    break
                if not self._start(active):
                    break
                taken.append(offered.rid)
                free -= extend + active.reserve()
                reserved += active.admission_reserve()
                room = self._offline_chunk(budget, active, room, chunks)
                if cut:
                    break
            self._offline_policy.admitted(taken)
            left_chunked = bool(chunks) and chunks[-1][1] < chunks[-1][0].prefill_left
            if len(taken) < len(proposal) or not taken or left_chunked:
                return

    def _echo_prefill(self, plan: IterationPlan, room: int, chunks: list[tuple[_Active, int]]) -> None:
        """Offline prompts under way first (they cannot pause), then Echo's selection among the
        policy's first proposals, admitted in the selector's order, each chunk capped by it."""
        budget = plan.budget
        under_way = [a for a in self.running if not a.online and a.prefill_left]
        for active in under_way:
            room = self._offline_chunk(budget, active, room, chunks, must_progress=True)
        if still_chunked(chunks):
            room = 0
        slots = self.cfg.max_running - len(self.running)
        free = self._free() + self.cache.evictable - sum(a.admission_reserve() for a in self.running)
        window = self.cfg.echo_window
        proposal = self._offline_policy.propose(max(int(free), 0), min(window, slots)) if room > 0 and slots > 0 else []
        candidates = [self._candidate(self.offline[offered.rid]) for offered in proposal]
        # the plugin's selector may cut a prompt only when no chunked prefill was under way
        admit = self.controller.choose_offline(plan, candidates, truncate=not under_way, window=window)
        by_rid = {candidate.rid: candidate for candidate in candidates}
        taken = []
        for rid, chunk in admit.items():
            active = self.offline[rid]
            extend = by_rid[rid].extend
            cut = min(chunk, room) < extend
            if room <= 0 or extend + active.reserve() > free or not self._start(active):
                break
            taken.append(rid)
            free -= extend + active.reserve()
            room = self._offline_chunk(budget, active, room, chunks, cap=chunk)
            if cut:
                break
        self._offline_policy.admitted(taken)

    def _candidate(self, active: _Active) -> OfflineCandidate:
        """What `_start` would prefill: the prompt and any output past the resident prefix, at least one token."""
        total = active.prompt_len + active.generated
        extend = max(1, total - self.cache.cached_prefix(active.request.prefix))
        return OfflineCandidate(
            active.rid, extend, total - extend, active.reserve(), fresh=active.rid not in self.started
        )

    def _offline_chunk(
        self,
        budget: IterationBudget,
        active: _Active,
        room: int,
        chunks: list[tuple[_Active, int]],
        cap: int | None = None,
        must_progress: bool = False,
    ) -> int:
        """``must_progress``: a prompt already under way holds its KV, so it gets at least a
        minimal chunk, as the plugin gives SGLang's chunked request (`chunked_limit`)."""
        prefix = active.context
        chunk = min(
            budget.offline_chunk(active.prefill_left, prefix, active.reserve(), must_progress=must_progress), room
        )
        if cap is not None:
            chunk = min(chunk, cap)
        if chunk <= 0:
            return room
        budget.commit_offline_prefill(chunk, prefix, chunk == active.prefill_left, active.reserve())
        chunks.append((active, chunk))
        self.counts["offline_prefill_computed"] += chunk
        return room - chunk

    def _emit_token(self, active: _Active) -> int:
        """One output token for ``active``; returns the offline tokens it adds to throughput."""
        active.generated += 1
        active.private += 1
        self.private_used += 1
        counted = 0
        if active.online:
            timing = active.timing
            assert timing is not None, "an online request is given its timing on arrival"
            if timing.ttft is None:
                timing.ttft = self.now - active.arrival
            else:
                timing.gaps.append(self.now - active.last_token)
            timing.tokens += 1
        else:
            counted = 1
            if not active.prompt_counted:
                active.prompt_counted = True
                counted += active.prompt_len
        active.last_token = self.now
        if active.generated >= active.request.output_len:
            self._finish(active)
        elif not active.online and active.generated % PROGRESS_INTERVAL == 0:
            self._offline_policy.progress(active.rid, active.generated)
        return counted

    def _finish(self, active: _Active) -> None:
        self._release(active)
        if active.online:
            self.online_left -= 1
        else:
            self.counts["offline_finished"] += 1
            self._offline_policy.finished(active.rid, active.generated)
