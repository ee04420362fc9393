"""Iteration-level simulation of RT/BE co-location, comparing BROS with the baselines it names.

RT requests arrive on a fixed trace; BE requests run in a closed loop (a finished one is
replaced at once, as a batch job keeps its window full). Each iteration a policy picks the batch
and places its KV, the modelled device says how long it took, and every request in the batch
produces one token, except a prefill chunk short of its prompt's end. Policies:

- ``fcfs``: one first-come-first-served queue over both classes with continuous batching, as
  SGLang and vLLM run by default; admission while KV and the prefill token budget allow, and a
  decode that finds no KV retracts the newest request, which recomputes later.
- ``rr``: two FCFS queues served in alternate iterations (the paper's round-robin baseline).
- ``bros-recompute``: Alg. 1 and the adaptive batch size over single-owner blocks; an RT
  request short of KV drops a whole BE request, which recomputes.
- ``bros``: Alg. 1 over the bidirectional layout with lazy checkpointing.

Both BROS policies run the same `sgl_blend.core.bros` code the SGLang plugin runs. Every policy
gets the same per-iteration prefill token budget (SGLang's ``--max-prefill-tokens``): a prefill
beyond the first that would exceed it waits for a later iteration. In BROS's plans such a request
sits the iteration out, as one that finds no KV does.

The BE load is a closed loop of synthetic jobs (`BestEffortLoop`) or a fixed list of requests
(`BestEffortPool`: a batch job's lines, each run once). Anything that wants the token stream
(`ServiceMetrics`, or the co-location benchmark's recorder in `sim.bros_colocation`) listens
through `TokenListener`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sgl_blend.core.bros.batch_size import AdaptiveBatchSize
from sgl_blend.core.bros.bidirectional_kv import BidirectionalKV
from sgl_blend.core.bros.cost import IterationCost
from sgl_blend.core.bros.metrics import ServiceMetrics
from sgl_blend.core.bros.packing import BrosPlan, BrosScheduler, MemoryState
from sgl_blend.core.bros.requests import SLO, BrosRequest
from sgl_blend.core.latency_model import BatchShape

POLICIES = ("fcfs", "rr", "bros-recompute", "bros")


@dataclass(frozen=True)
class SimSettings:
    """``drain_realtime``: keep running past ``duration_s`` until every RT request has finished
    (the co-location benchmark judges every online request's latency)."""

    kv_tokens: int = 32768
    block_size: int = 16
    max_running: int = 256
    prefill_token_budget: int = 8192
    duration_s: float = 60.0
    be_concurrency: int = 64
    be_prompt: tuple[int, int] = (512, 1024)
    be_output: tuple[int, int] = (32, 128)
    slo: SLO = field(default_factory=SLO)
    seed: int = 0
    drain_realtime: bool = False


@dataclass(frozen=True)
class Arrival:
    rid: str
    at: float
    prompt_len: int
    output_len: int


class Device(Protocol):
    """What the loop asks of the modelled device: how long a batch takes with a swap beside it."""

    def iteration_s(self, shape: BatchShape, swap_tokens: int) -> float: ...


class TokenListener(Protocol):
    """What sees the requests' lifetimes (`ServiceMetrics` is one)."""

    def arrived(self, rid: str, realtime: bool, now: float) -> None: ...

    def received(self, rid: str, now: float) -> None:
        """The engine's loop took an RT request in, at its first iteration after the arrival."""
        ...

    def token(self, rid: str, now: float) -> None: ...

    def finished(self, rid: str, now: float) -> None: ...


class Policy(ABC):
    """What the engine asks of a scheduler each iteration."""

    @abstractmethod
    def submit(self, request: BrosRequest) -> None: ...

    @abstractmethod
    def step(self, now: float) -> tuple[list[BrosRequest], int]:
        """The requests that run now and the KV tokens swapped in for them."""

    @abstractmethod
    def done(self, now: float, finished: set[str], measured_s: float) -> None: ...


class FifoPolicy(Policy):
    """Continuous batching over FCFS queues; ``alternate`` serves the RT and BE queues in turn."""

    def __init__(self, settings: SimSettings, alternate: bool) -> None:
        self.settings = settings
        self.alternate = alternate
        self.waiting: dict[bool, deque[BrosRequest]] = {True: deque(), False: deque()}
        self.running: list[BrosRequest] = []
        self.kv_used: dict[str, int] = {}
        self.free = settings.kv_tokens
        self.turn = True
        self._ran: list[BrosRequest] = []

    def submit(self, request: BrosRequest) -> None:
        self.waiting[request.realtime if self.alternate else True].append(request)

    def _serving(self) -> bool | None:
        """Which queue runs now (None: the single FCFS queue)."""
        if not self.alternate:
            return None
        has_work = {
            cls: bool(self.waiting[cls]) or any(r.realtime == cls for r in self.running) for cls in (True, False)
        }
        if not has_work[self.turn]:
            self.turn = not self.turn
        serving, self.turn = self.turn, not self.turn
        return serving

    def _retract(self, request: BrosRequest) -> None:
        self.running.remove(request)
        self.free += self.kv_used.pop(request.rid, 0)
        request.dropped = request.prefilled
        self.waiting[request.realtime if self.alternate else True].appendleft(request)

    def step(self, now: float) -> tuple[list[BrosRequest], int]:
        serving = self._serving()
        self._ran = self._serve(serving)
        if not self._ran and serving is not None:
            self._ran = self._serve(not serving)  # a turn with nothing runnable passes to the other class
        return self._ran, 0

    def _serve(self, serving: bool | None) -> list[BrosRequest]:
        decodes = [r for r in self.running if serving is None or r.realtime == serving]
        while decodes and len(decodes) > self.free:
            victim = decodes.pop()
            self._retract(victim)
        self.free -= len(decodes)
        for request in decodes:
            self.kv_used[request.rid] += 1
        queue = self.waiting[True if serving is None else serving]
        budget = self.settings.prefill_token_budget
        admitted: list[BrosRequest] = []
        while queue and len(self.running) + len(admitted) < self.settings.max_running:
            request = queue[0]
            need = request.extend_tokens()
            if need > self.free or (admitted and need > budget):
                break
            queue.popleft()
            budget -= need
            self.free -= need
            self.kv_used[request.rid] = need
            request.dropped = False
            admitted.append(request)
        self.running.extend(admitted)
        return decodes + admitted

    def done(self, now: float, finished: set[str], measured_s: float) -> None:
        for request in self._ran:
            request.step_done(now)
            if request.rid in finished:
                self.running.remove(request)
                self.free += self.kv_used.pop(request.rid)


class BrosPolicy(Policy):
    def __init__(self, settings: SimSettings, cost: IterationCost, bidirectional: bool) -> None:
        self.prefill_token_budget = settings.prefill_token_budget
        self.scheduler = BrosScheduler(cost, settings.slo, AdaptiveBatchSize(settings.max_running))
        self.kv = BidirectionalKV(
            settings.kv_tokens // settings.block_size, settings.block_size, bidirectional=bidirectional
        )
        self.requests: dict[str, BrosRequest] = {}
        self._plan: BrosPlan | None = None
        self._not_run: list[str] = []
        self.checkpointed_tokens = 0

    def submit(self, request: BrosRequest) -> None:
        self.requests[request.rid] = request
        self.scheduler.submit(request)

    def _evict_order(self, protect: set[str], now: float, realtime_too: bool) -> Iterator[str]:
        """Whole requests that may leave the device when nothing else fits: BE first, then RT
        with the most time left. A generator: worked out only when it is needed."""
        idle = [r for r in self.requests.values() if r.rid not in protect and self.kv.resident(r.rid)]
        yield from (r.rid for r in idle if not r.realtime)
        if realtime_too:
            realtime = sorted((r for r in idle if r.realtime), key=lambda r: -r.residual(now, self.scheduler.slo))
            yield from (r.rid for r in realtime)

    def step(self, now: float) -> tuple[list[BrosRequest], int]:
        """Place the plan's KV; a request that finds no room sits this iteration out."""
        memory = MemoryState(
            self.kv.claimable_slots(True),
            self.kv.best_effort_resident(),
            self.kv.claimable_slots(False),
            self.kv.own_room(),
        )
        plan = self.scheduler.plan(now, memory)
        protect = {r.rid for r in plan.requests}
        over = self._over_prefill_budget(plan.requests)
        not_run = [r.rid for r in plan.requests if r.rid in over or not self._place(r, protect, now)]
        self._sync_victims()
        self._plan, self._not_run = plan, not_run
        skipped = set(not_run)
        ran = [r for r in plan.requests if r.rid not in skipped]
        return ran, sum(r.host_tokens for r in ran)

    def _over_prefill_budget(self, requests: Sequence[BrosRequest]) -> set[str]:
        """Prefills, in the plan's order (RT by urgency, then BE), past the first one that would
        take the batch over the prefill token budget: they wait, as in `FifoPolicy`."""
        left, over, first = self.prefill_token_budget, set(), True
        for request in requests:
            if not request.is_prefill():
                continue
            need = request.extend_tokens()
            if not first and need > left:
                over.add(request.rid)
                continue
            left -= need
            first = False
        return over

    def _place(self, request: BrosRequest, protect: set[str], now: float) -> bool:
        """Bring back the request's checkpointed tokens, then slots for its new ones. Room comes
        from free slots, then (RT only) BE slots and whole BE requests; for its new tokens an RT
        request may also move whole RT requests out (BROS's "drop BE, then RT by remaining
        time"), but not to bring its own tokens back -- RT requests would swap each other out in
        turn."""
        realtime = request.realtime
        if (
            request.host_tokens
            and self.kv.restore(request.rid, protect, self._evict_order(protect, now, False) if realtime else ())
            is None
        ):
            return False
        order = self._evict_order(protect, now, True) if realtime else ()
        return self.kv.allocate(request.rid, request.extend_tokens(), realtime, protect, order) is not None

    def _sync_victims(self) -> None:
        for request in self.requests.values():
            host = self.kv.host_tokens(request.rid)
            self.checkpointed_tokens += max(host - request.host_tokens, 0)
            request.host_tokens = host
            if self.kv.take_dropped(request.rid):
                request.dropped = True

    def done(self, now: float, finished: set[str], measured_s: float) -> None:
        assert self._plan is not None, "an iteration is done after step planned it"
        self.scheduler.finish(self._plan, now, finished, self._not_run, measured_s)
        for rid in finished:
            self.kv.release(rid)
            self.requests.pop(rid, None)


def make_policy(name: str, settings: SimSettings, cost: IterationCost) -> Policy:
    if name == "fcfs":
        return FifoPolicy(settings, alternate=False)
    if name == "rr":
        return FifoPolicy(settings, alternate=True)
    if name in ("bros", "bros-recompute"):
        return BrosPolicy(settings, cost, bidirectional=name == "bros")
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")


class BestEffortSource(Protocol):
    """Where BE requests come from: the next one and its output length (None: no more)."""

    def next(self, now: float) -> tuple[BrosRequest, int] | None: ...


class BestEffortLoop:
    """Closed-loop BE jobs: prompt ~ U(a, b), output ~ U(c, d), seeded."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.rng = random.Random(settings.seed + 1)
        self.count = 0

    def next(self, now: float) -> tuple[BrosRequest, int]:
        self.count += 1
        prompt = self.rng.randint(*self.settings.be_prompt)
        output = self.rng.randint(*self.settings.be_output)
        return BrosRequest(f"be-{self.count}", False, now, prompt), output


class BestEffortPool:
    """BE requests from a fixed list of ``(rid, prompt_len, output_len)``, in its order, each once:
    the lines of a batch job, kept ``be_concurrency`` at a time in the scheduler's queue."""

    def __init__(self, requests: Sequence[tuple[str, int, int]]) -> None:
        self._left = deque(requests)

    def next(self, now: float) -> tuple[BrosRequest, int] | None:
        if not self._left:
            return None
        rid, prompt_len, output_len = self._left.popleft()
        return BrosRequest(rid, False, now, prompt_len), output_len


def simulate(
    policy_name: str,
    arrivals: Sequence[Arrival],
    device: Device,
    cost: IterationCost,
    settings: SimSettings,
    be_source: BestEffortSource | None = None,
    listeners: Sequence[TokenListener] = (),
    cached_prefix: Callable[[BrosRequest], int] | None = None,
) -> dict:
    """Run one policy on one RT trace for ``settings.duration_s`` simulated seconds (and, with
    ``drain_realtime``, until the last RT request finishes). BE requests come from ``be_source``
    (default: the synthetic closed loop); ``listeners`` see every arrival, token and finish.
    ``cached_prefix`` gives the prompt tokens an engine's radix cache holds for a request whose
    prefill starts now: the device computes only the rest (the plan's chunk of it, from the hit on),
    while the plan priced the whole prompt, as the plugin's BROS does (it sees no cache hit before
    SGLang's adder matches the prompt)."""
    policy = make_policy(policy_name, settings, cost)
    metrics = ServiceMetrics(settings.slo)
    watchers: list[TokenListener] = [metrics, *listeners]
    outputs: dict[str, int] = {}
    source = be_source if be_source is not None else BestEffortLoop(settings)

    def submit(request: BrosRequest, output: int, now: float) -> None:
        outputs[request.rid] = output
        for watcher in watchers:
            watcher.arrived(request.rid, request.realtime, now)
        policy.submit(request)

    def next_best_effort(now: float) -> None:
        job = source.next(now)
        if job is not None:
            submit(*job, now)

    for _ in range(settings.be_concurrency):
        next_best_effort(0.0)
    pending = deque(sorted(arrivals, key=lambda a: a.at))
    live: dict[str, BrosRequest] = {}
    now, iterations, busy, idle = 0.0, 0, 0.0, 0.0
    while now < settings.duration_s or (settings.drain_realtime and (live or pending)):
        while pending and pending[0].at <= now:
            arrival = pending.popleft()
            request = BrosRequest(arrival.rid, True, arrival.at, arrival.prompt_len)
            live[request.rid] = request
            submit(request, arrival.output_len, arrival.at)
            for watcher in watchers:
                watcher.received(request.rid, now)
        batch, swap = policy.step(now)
        if not batch:
            # Nothing can run (nothing waiting, or no room for what is): idle until the next arrival.
            if not pending:
                break
            idle += max(pending[0].at - now, 0.0)
            now = max(now, pending[0].at)
            continue
        shape = BatchShape()
        for request in batch:
            # SGLang's adder matches a starting prompt in the radix cache: its chunk starts past the hit
            request.prompt_done = max(request.prompt_done, _cache_hit(request, cached_prefix))
            shape = request.add_to(shape)
        elapsed = device.iteration_s(shape, swap)
        now += elapsed
        busy += elapsed
        iterations += 1
        yielding = [r for r in batch if r.yields_token()]
        finished = {r.rid for r in yielding if r.generated + 1 >= outputs[r.rid]}
        for request in yielding:
            for watcher in watchers:
                watcher.token(request.rid, now)
        policy.done(now, finished, elapsed)
        for rid in finished:
            for watcher in watchers:
                watcher.finished(rid, now)
            if rid in live:
                live.pop(rid)
            else:
                next_best_effort(now)
    summary = metrics.summary(now)
    summary.update(
        {
            "policy": policy_name,
            "iterations": iterations,
            "simulated_s": now,
            "rt_unfinished": len(live),
            "mean_iteration_s": busy / iterations if iterations else None,
            "busy_s": busy,
            "idle_s": idle,
        }
    )
    if isinstance(policy, BrosPolicy):
        summary["checkpointed_tokens"] = policy.checkpointed_tokens
    return summary


def _cache_hit(request: BrosRequest, cached_prefix: Callable[[BrosRequest], int] | None) -> int:
    """The cached prompt tokens of a prefill that starts now, whole or as its plan's first chunk (a
    recomputed one is priced as planned); at least one token is always computed."""
    if cached_prefix is None or request.prefilled or request.dropped or request.prompt_done:
        return 0
    return min(cached_prefix(request), request.prompt_len - 1)


def poisson_arrivals(lengths: Iterable[tuple[int, int]], rate: float, duration_s: float, seed: int) -> list[Arrival]:
    """RT arrivals at ``rate`` per second over ``duration_s``, cycling through ``lengths``."""
    rng = random.Random(seed)
    pool = list(lengths)
    arrivals: list[Arrival] = []
    now, index = 0.0, 0
    while True:
        now += rng.expovariate(rate)
        if now >= duration_s:
            return arrivals
        prompt, output = pool[index % len(pool)]
        arrivals.append(Arrival(f"rt-{index}", now, prompt, output))
        index += 1
