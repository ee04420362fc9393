"""Offline admission policies behind the one engine boundary, `AdmissionPolicy`.

All policies share the bookkeeping -- the prefix tree, output-length estimates, re-planning when
the pending set has changed materially, and a `DualScanner` that enforces memory shares -- and
differ only in how they order the pending requests:

- ``blendserve``: sample output lengths, layer-wise sort, split, merge, scan from both ends;
- ``dfs``: the tree's DFS order (maximal prefix sharing), one cursor;
- ``fcfs``: arrival order, one cursor;
- ``random``: a seeded shuffle, one cursor (the "balance" baseline).

A request that arrives with a `Placement` was planned outside the engine over its whole batch;
the policy admits such requests by their placement and never re-plans them from the few it
holds (its own order covers only unplaced requests, scanned between the placed sides).

A single-cursor policy is a dual scan whose memory side is empty, which the scanner handles as
its one-side-empty case by giving the compute side all of the memory.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import replace

from sgl_blend.core.cost_model import CostModel, HardwareSpec, ModelSpec
from sgl_blend.core.dual_scan import COMPUTE, DualScanner
from sgl_blend.core.output_length import DEFAULT_SAMPLE_RATE, OutputLengthEstimator
from sgl_blend.core.placement import MEMORY, SAMPLE, Placement
from sgl_blend.core.planner import DEFAULT_SPLIT_THRESHOLD, Plan, TreePlanner
from sgl_blend.core.prefix_tree import Node, PrefixTree
from sgl_blend.core.protocol import OfflineRequest
from sgl_blend.core.request_state import RequestState, Status
from sgl_blend.core.scan_load import Load

REPLAN_FRACTION = 0.05
# Requests that arrive placed (planned by the runner over the whole batch) come, on each side, after
# the ones the scan already holds: they need no new order, only to join the scan, which they do once
# they are this share of what it holds. Re-planning at every wave of them rebuilt the scan each
# iteration: a third of the scheduler's time with 2,048 requests running (bench.feed_rate, 20,000 lines).
PLACED_REPLAN_FRACTION = 0.5
SAMPLE_SIDE = SAMPLE
# SGLang's own threshold for deferring a request whose prefix another request of the same batch
# is about to compute (``IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD`` in
# ``schedule_policy.py``, applied there by LPM only): shorter shared prefixes are recomputed.
IN_BATCH_PREFIX_TOKENS = 32


class PlannedPolicy(ABC):
    """The shared machinery; subclasses provide `_order`.

    Each request is one `RequestState`, found by its tree index or its rid (`_requests` keeps
    them in arrival order, which FCFS and its kin order by); the pending samples also wait in a
    queue of their own, oldest first (a preempted sample goes to its end)."""

    name = "planned"
    default_sample_rate = 0.0
    paces_prefill = False
    # Whether a request waits for a shared prefix another request is still computing (see
    # `_prefix_in_flight`).
    computes_prefixes_once = False

    def __init__(
        self,
        cost_model: CostModel,
        *,
        seed: int = 0,
        replan_fraction: float = REPLAN_FRACTION,
        sample_rate: float | None = None,
        paced: bool | None = None,
        batches_in_flight: int = 1,
        one_cursor: bool = False,
    ) -> None:
        self.cost_model = cost_model
        # ``one_cursor`` walks the whole order from its compute-heavy end, with no memory side:
        # BlendServe's order without its dual scan (the ablation that shows what blending adds).
        self.one_cursor = one_cursor
        # Forwards between a request's admission and the radix cache holding its prompt: 1 when
        # the engine processes each batch's result before it schedules the next (the simulator);
        # 2 under SGLang's overlap scheduler, which schedules the next batch while the previous
        # one runs (SGLang's own ``chunks_in_flight``). `advance` counts processed results.
        self.batches_in_flight = batches_in_flight
        self.sharing = cost_model.sharing_price()
        self.sample_rate = self.default_sample_rate if sample_rate is None else sample_rate
        # ``paced`` overrides the class default, so any order can run with BlendServe's Alg. 3
        # prefill pacing (the "DFS + the same pacing" baseline) and BlendServe without it.
        self.paces_prefill = self.paces_prefill if paced is None else paced
        self.seed = seed
        self.replan_fraction = replan_fraction
        self.tree = PrefixTree()
        self.estimator = OutputLengthEstimator(self.tree, self.sample_rate, seed)
        self.capacity = float(cost_model.kv_capacity_tokens())
        self._requests: dict[int, RequestState] = {}
        self._by_rid: dict[str, RequestState] = {}
        self._next_index = 0
        self._sample_queue: dict[int, RequestState] = {}
        self._proposal: list[RequestState] = []
        self._pending_count = 0
        self._unplanned_count = 0
        self._unplaced_count = 0
        self._estimates_stale = False
        self.scanner: DualScanner | None = None
        self.last_plan: Plan | None = None
        self._iteration = 0
        self.plans = 0

    def set_kv_capacity(self, kv_tokens: int) -> None:
        self.capacity = float(kv_tokens)
        if self.scanner is not None:
            self.scanner.capacity = self.capacity

    def _set_status(self, state: RequestState, status: Status) -> None:
        if state.status is Status.PENDING:
            self._pending_count -= 1
        if status is Status.PENDING:
            self._pending_count += 1
        state.status = status

    def submit(self, requests: Iterable[OfflineRequest]) -> None:
        for request in requests:
            if request.rid in self._by_rid:
                continue
            index = self._next_index
            self._next_index += 1
            placement = request.placement
            sampled = self.estimator.register(
                index,
                request.max_new_tokens,
                request.exact_output_len,
                placement.output if placement is not None else None,
            )
            sampled = sampled or (placement is not None and placement.side == SAMPLE_SIDE)
            state = RequestState(index, request, sample=sampled, unplanned=not sampled)
            self._requests[index] = self._by_rid[request.rid] = state
            self._pending_count += 1
            output = self.estimator.estimate(index)
            prompt = len(request.prompt_ids)
            self.tree.insert(
                index,
                request.prompt_ids,
                self.cost_model.comp_time(prompt, output),
                self.cost_model.mem_time(prompt, output),
            )
            if sampled:
                self._sample_queue[index] = state
            else:
                self._unplanned_count += 1
                self._unplaced_count += placement is None

    def footprint(self, index: int) -> float:
        """KV tokens the engine counts against a request, on average over its life: its output,
        the part of its prompt no other request shares, and the decode room SGLang reserves for
        it. A shared prefix is cached once by the radix cache whoever uses it, so charging it to
        every request would admit a fraction of what fits exactly when sharing is high; leaving
        out the reserve would promise more long ``ignore_eos`` requests than the engine admits."""
        request = self._requests[index].request
        return self.cost_model.kv_commitment(
            self.tree.unshared_tokens(index),
            self.estimator.estimate(index),
            request.max_new_tokens,
            request.exact_output_len,
        )

    def load(self, index: int) -> Load:
        """A request's load for the scanner. Its prefill is the prompt less the prefix it reuses
        from the request before it in the plan (or, outside a plan, every prefix it shares)."""
        state = self._requests[index]
        prompt, unshared = self.tree.prompt_len[index], self.tree.unshared_tokens(index)
        reuse = prompt - unshared if state.reuse is None else state.reuse
        comp, mem = self.tree.cost(index)
        return Load(
            comp=comp - self.sharing.prefix_saving(reuse),
            mem=mem,
            prefill=prompt - reuse,
            steps=self.estimator.estimate(index),
            commit=self.footprint(index),
            prompt=prompt,
            unshared_prompt=unshared,
            max_new_tokens=state.request.max_new_tokens,
            exact=state.request.exact_output_len,
        )

    def _needs_plan(self) -> bool:
        if self._estimates_stale and not self.estimator.pending_samples():
            return True
        if not self._unplanned_count:
            return False
        planned_pending = self.scanner.pending() if self.scanner else 0
        return (
            planned_pending == 0
            or self._unplaced_count >= self.replan_fraction * planned_pending
            or self._unplanned_count >= PLACED_REPLAN_FRACTION * planned_pending
        )

    def _pending(self) -> list[RequestState]:
        return [state for state in self._requests.values() if state.status is Status.PENDING]

    def _plan(self) -> None:
        pending = self._pending()
        if self._estimates_stale and not self.estimator.pending_samples():
            for state in pending:
                output = self.estimator.estimate(state.index)
                prompt = self.tree.prompt_len[state.index]
                self.tree.update_cost(
                    state.index, self.cost_model.comp_time(prompt, output), self.cost_model.mem_time(prompt, output)
                )
            self._estimates_stale = False
        planned = [state for state in pending if not state.sample]
        unplaced = {state.index for state in planned if state.placement is None}
        # Lines planned outside the engine arrive placed: with none unplaced there is nothing to order
        # (a tree-wide pass each time a wave of placed arrivals triggers a plan).
        order = self._order(unplaced.__contains__) if unplaced else Plan([], 0, 0.0, 0, 1.0)
        plan = self._with_placed(
            order, [(state.index, state.placement) for state in planned if state.placement is not None]
        )
        for state in self._requests.values():
            state.reuse = plan.reuse.get(state.index)
            state.unplanned = False
        beyond = self._beyond(plan)
        if self.one_cursor:
            plan, beyond = replace(plan, boundary=len(plan.order)), {COMPUTE: sum(beyond.values())}
        scanner = DualScanner(
            plan.order, plan.boundary, self.capacity, self.load, paced=self.paces_prefill, beyond=beyond
        )
        if self.scanner is not None:
            scanner.carry_over(self.scanner)
        self.scanner = scanner
        self.last_plan = plan
        self.plans += 1
        self._unplanned_count = 0
        self._unplaced_count = 0

    def _beyond(self, plan: Plan) -> dict[str, int]:
        """Per side, the placed requests of the global plan not yet here: the front request of
        the side (first to scan) knows how many of its side follow it, and those already here
        are not beyond."""
        beyond = {}
        for side, front in ((COMPUTE, min), (MEMORY, max)):
            here = [
                (placement.position, placement.after)
                for index in plan.order
                if (placement := self._requests[index].placement) is not None
                and placement.after is not None
                and (placement.side == MEMORY) == (side == MEMORY)
            ]
            if here:
                _position, after = front(here, key=lambda entry: entry[0])
                beyond[side] = max((after or 0) + 1 - len(here), 0)  # after is set: the list holds no other
        return beyond

    @staticmethod
    def _with_placed(plan: Plan, placed: list[tuple[int, Placement]]) -> Plan:
        """The plan with the placed requests around it: their compute side first, by position,
        and their memory side last, so the memory cursor meets its highest position first."""
        if not placed:
            return plan
        placed.sort(key=lambda item: item[1].position)
        compute = [index for index, placement in placed if placement.side != MEMORY]
        memory = [index for index, placement in placed if placement.side == MEMORY]
        order = compute + plan.order + memory
        return Plan(order, len(compute) + plan.boundary, plan.root_density, plan.splits, plan.sharing_kept, plan.reuse)

    def prefill_token_budget(self) -> int | None:
        """Prefill tokens the engine should put in the next iteration; None keeps its default."""
        if not self.paces_prefill or self.scanner is None:
            return None
        budget = self.scanner.prefill_budget()
        return None if budget is None else max(1, round(budget))

    def advance(self, iterations: int) -> None:
        if self.scanner is not None:
            self.scanner.advance(iterations)
        self._iteration += iterations

    def _path(self, index: int) -> list[Node]:
        """The nodes of a request's prompt, root excluded."""
        return self.tree.path(self.tree.node_of[index])[1:]

    def _shared_path(self, index: int) -> list[Node]:
        """The nodes of a request's prompt it shares with other requests (its own node too when
        another request ends there or below it)."""
        path = self._path(index)
        return path if path and path[-1].count > 1 else path[:-1]

    def _prefix_in_flight(self, index: int, tentative: set[int]) -> bool:
        """Whether enough of the request's shared prefix is still being computed by another
        request -- admitted within the last ``batches_in_flight`` processed forwards, or
        ``tentative``: proposed before it -- that it should wait and find it cached. SGLang takes
        a prefix into its radix tree when it processes the result of the forward that computed
        it, so a request admitted before then computes it again; the paper's engine computes a
        shared prefix exactly once.

        Only a running request computes anything. With none running, every admitted request's
        result has been processed (its prefix is cached) or it was preempted (its prefix must be
        computed again anyway), and no forward will come to count: a request held then would
        wait forever on an idle engine. So a held request is always released when nothing else
        can run."""
        cached_from = self._iteration - self.batches_in_flight
        running = len(self._requests) > self._pending_count
        in_flight = sum(
            node.edge_len
            for node in self._shared_path(index)
            if id(node) in tentative or (running and node.first_admitted > max(cached_from, -1))
        )
        return in_flight >= IN_BATCH_PREFIX_TOKENS

    def _once_per_prefix(self, chosen: list[tuple[int, str]]) -> list[tuple[int, str]]:
        """``chosen`` less every request whose shared prefix is in flight, and what its side
        proposed after it (a side's order is kept)."""
        tentative: set[int] = set()
        deferred_sides: set[str] = set()
        kept = []
        for index, side in chosen:
            if side in deferred_sides:
                continue
            if side != SAMPLE_SIDE and self._prefix_in_flight(index, tentative):
                deferred_sides.add(side)
                continue
            tentative.update(id(node) for node in self._shared_path(index) if node.first_admitted < 0)
            kept.append((index, side))
        return kept

    @abstractmethod
    def _order(self, include: Callable[[int], bool]) -> Plan:
        """Order the pending requests that ``include`` accepts."""

    def _arrivals(self, include: Callable[[int], bool]) -> list[int]:
        """The requests ``include`` accepts, oldest first."""
        return [index for index in self._requests if include(index)]

    def propose(self, free_kv_tokens: int, max_requests: int) -> list[OfflineRequest]:
        free = float(free_kv_tokens)
        chosen: list[tuple[int, str]] = []
        for index in self._sample_queue:
            if len(chosen) >= max_requests or self.footprint(index) > free:
                break
            chosen.append((index, SAMPLE_SIDE))
            free -= self.footprint(index)
        if self._needs_plan():
            self._plan()
        if self.scanner is not None and len(chosen) < max_requests:
            chosen += self.scanner.propose(free, max_requests - len(chosen))
        if self.computes_prefixes_once:
            chosen = self._once_per_prefix(chosen)
        for state in self._proposal:
            state.proposed = None
        self._proposal = [self._requests[index] for index, _side in chosen]
        for state, (_index, side) in zip(self._proposal, chosen):
            state.proposed = side
        return [state.request for state in self._proposal]

    def admitted(self, rids: Iterable[str]) -> None:
        for rid in rids:
            state = self._by_rid[rid]
            index = state.index
            if self.computes_prefixes_once:
                # Its whole path, unshared nodes too: a request arriving later that shares part
                # of it splits the node, and the shared upper part keeps the mark.
                depth = 0
                for node in self._path(index):
                    if node.first_admitted < 0:
                        node.first_admitted = self._iteration
                        if state.computes_from is None:
                            state.computes_from = depth
                    depth += node.edge_len
            state.side = SAMPLE_SIDE if state.sample else state.proposed or COMPUTE
            state.proposed = None
            self._set_status(state, Status.RUNNING)
            if state.sample:
                self._sample_queue.pop(index, None)
                self._estimates_stale = True
            elif self.scanner is not None:
                self.scanner.admit(index, state.side)

    def prefill_continues(self, rid: str) -> None:
        """The engine gave a chunked request its next prefill chunk. The prefix it was the first
        to compute reaches the cache only after its last chunk, so its nodes count as admitted
        now, and requests sharing them wait on (`_prefix_in_flight`). No stall: this comes only
        from a forward that runs the request."""
        state = self._by_rid.get(rid)
        if state is None or state.computes_from is None:
            return
        depth = 0
        for node in self._path(state.index):
            if depth >= state.computes_from:
                node.first_admitted = self._iteration
            depth += node.edge_len

    def progress(self, rid: str, decoded_tokens: int) -> None:
        state = self._by_rid.get(rid)
        if state is None or self.scanner is None:
            return
        index = state.index
        self.scanner.progress(index, decoded_tokens)
        if self.scanner.side(index) == COMPUTE and decoded_tokens > self.estimator.estimate(index):
            self.scanner.move_to_memory_side(index, self.tree.prompt_len[index] + decoded_tokens)

    def preempted(self, rid: str) -> None:
        state = self._by_rid[rid]
        self._set_status(state, Status.PENDING)
        if state.side == SAMPLE_SIDE:
            self._sample_queue[state.index] = state
        elif self.scanner is not None:
            self.scanner.requeue(state.index)
        state.side = None

    def finished(self, rid: str, output_len: int) -> None:
        state = self._by_rid.get(rid)
        if state is None:
            return
        self.estimator.observe(state.index, output_len)
        if self.scanner is not None:
            self.scanner.release(state.index)
        self._forget(state)

    def withdraw(self, rid: str) -> None:
        state = self._by_rid.get(rid)
        if state is None:
            return
        self._sample_queue.pop(state.index, None)
        if self.scanner is not None:
            self.scanner.withdraw(state.index)
        self._forget(state)

    def _forget(self, state: RequestState) -> None:
        self._set_status(state, Status.DONE)
        if state.unplanned:
            self._unplanned_count -= 1
            self._unplaced_count -= state.placement is None
        self.tree.remove(state.index)
        self.estimator.forget(state.index)
        del self._requests[state.index], self._by_rid[state.rid]

    def admission_side(self, rid: str) -> str | None:
        return None

    def annotation(self, rid: str) -> tuple[float, int] | None:
        state = self._by_rid.get(rid)
        if state is None:
            return None
        load = self.load(state.index)
        node = self.tree.node_of[state.index]
        sharers = node.parent.count if node.parent is not None and node.parent.parent is not None else node.count
        return (load.comp / load.mem if load.mem > 0 else float("inf"), max(sharers - 1, 0))

    def pending_count(self) -> int:
        return self._pending_count


class BlendServePolicy(PlannedPolicy):
    """On a device whose measured co-run overlap hides nothing (`HardwareSpec.blending_pays`
    false, as on a CPU), blending compute- with memory-heavy work cannot shorten a step: the
    policy then orders by prefix with one cursor, samples nothing and paces nothing, which is
    the best an order can do there (never worse than DFS)."""

    name = "blendserve"
    default_sample_rate = DEFAULT_SAMPLE_RATE
    paces_prefill = True
    computes_prefixes_once = True

    def __init__(self, cost_model: CostModel, *, split_threshold: float = DEFAULT_SPLIT_THRESHOLD, **kwargs) -> None:
        self.split_threshold = split_threshold
        self.blends = cost_model.hardware.blending_pays
        if not self.blends:
            kwargs.setdefault("paced", False)
            kwargs.setdefault("sample_rate", 0.0)
        super().__init__(cost_model, **kwargs)

    def _order(self, include: Callable[[int], bool]) -> Plan:
        if not self.blends:
            return _dfs_plan(self.tree, include)
        return TreePlanner(self.tree, self.sharing, include, self.split_threshold).plan()

    def admission_side(self, rid: str) -> str | None:
        """A running request's side; a pending one's is the side its proposal would admit it from
        (what the engine records when it admits from a proposal made a step before)."""
        state = self._by_rid.get(rid)
        if state is None:
            return None
        if state.status is Status.PENDING:
            return state.proposed
        if state.side == SAMPLE_SIDE:
            return SAMPLE_SIDE
        return self.scanner.side(state.index) if self.scanner else None


def _dfs_plan(tree: PrefixTree, include: Callable[[int], bool]) -> Plan:
    order = [index for index in tree.dfs_order() if include(index)]
    return Plan(order, len(order), 0.0, 0, 1.0)


class DFSPolicy(PlannedPolicy):
    name = "dfs"
    computes_prefixes_once = True

    def _order(self, include: Callable[[int], bool]) -> Plan:
        return _dfs_plan(self.tree, include)


class FCFSPolicy(PlannedPolicy):
    name = "fcfs"

    def _order(self, include: Callable[[int], bool]) -> Plan:
        order = self._arrivals(include)
        return Plan(order, len(order), 0.0, 0, 1.0)


class RandomPolicy(PlannedPolicy):
    name = "random"

    def _order(self, include: Callable[[int], bool]) -> Plan:
        order = sorted(index for index in self._requests if include(index))
        random.Random(self.seed + self.plans).shuffle(order)
        return Plan(order, len(order), 0.0, 0, 1.0)


POLICIES: dict[str, type[PlannedPolicy]] = {
    policy.name: policy for policy in (BlendServePolicy, DFSPolicy, FCFSPolicy, RandomPolicy)
}


def make_policy(name: str, model: ModelSpec, hardware: HardwareSpec, **options) -> PlannedPolicy:
    """The named policy over a cost model for ``model`` on ``hardware``."""
    if name not in POLICIES:
        raise ValueError(f"unknown offline policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name](CostModel(model, hardware), **options)
