"""An iteration-level model of SGLang's engine on a modelled GPU, driving a real `AdmissionPolicy`.

Each iteration: admit what the policy proposes while KV fits (evicting unreferenced cached
prefixes, least recently used first), run one step of continuous batching -- every decoding
request produces a token, and prefill chunks fill the rest of the token budget (mixed
prefill+decode) -- and charge its time as ``f((1 - s) T_comp, T_mem)`` from the cost model, with
s the share of prefill skipped by cache hits. KV that grows past capacity retracts the newest
request: its KV is dropped and, as in SGLang, it keeps the tokens it generated and recomputes
them as prompt when it returns. Admission reserves KV for the future output of everything running
at SGLang's new-token ratio, so retraction stays the exception it is in the real engine. Long decode-only stretches, when nothing
can be admitted, are advanced in one closed-form step up to the next finish, which is what lets
400K requests simulate in minutes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from sgl_blend.core.cost_model import CostModel
from sgl_blend.core.protocol import AdmissionPolicy, OfflineRequest
from sgl_blend.sim.overlap import OverlapFunction
from sgl_blend.sim.workload import SimRequest


@dataclass
class _Running:
    request: SimRequest
    prefill_left: int
    decoded: int = 0
    private_kv: int = 0
    prefix_hit: int = 0


@dataclass
class SimResult:
    seconds: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    comp_seconds: float
    mem_seconds: float
    iterations: int
    retractions: int
    admitted_order: list[str]
    finished_order: list[str]
    decoded_tokens: int
    peak_kv: int
    steps: list[tuple[float, float, int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds if self.seconds else 0.0

    @property
    def sharing_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class SimEngine:
    def __init__(
        self,
        cost_model: CostModel,
        policy: AdmissionPolicy,
        overlap: OverlapFunction,
        *,
        kv_capacity: int | None = None,
        chunk_tokens: int = 8192,
        max_running: int = 1024,
        step_records: int = 4000,
        new_token_ratio: float = 0.15,
    ) -> None:
        self.cost = cost_model
        self.policy = policy
        self.overlap = overlap
        self.capacity = kv_capacity or cost_model.kv_capacity_tokens()
        self.chunk_tokens = chunk_tokens
        self.max_running = max_running
        self.step_records = step_records
        self.new_token_ratio = new_token_ratio
        self._generated: dict[str, int] = {}
        self._prefixes: OrderedDict[object, list[int]] = OrderedDict()
        self._kv_used = 0
        self._flops_per_token = 2.0 * cost_model.model.params / cost_model.hardware.flops
        # Chunks sum to p^2/2 query-key pairs; twice the cost model's 4 H L per pair gives its 4 p^2 H L.
        self._attn = 8.0 * cost_model.model.hidden * cost_model.model.layers / cost_model.hardware.flops
        self._kv_read = cost_model.model.kv_dim * cost_model.model.layers * 2 * cost_model.model.dtype_bytes / cost_model.hardware.bandwidth

    def run(self, requests: Sequence[SimRequest], progress: Callable[[int], None] | None = None) -> SimResult:
        by_rid = {request.rid: request for request in requests}
        self.policy.set_kv_capacity(self.capacity)
        self.policy.submit(OfflineRequest(r.rid, r.prompt_ids, r.max_new_tokens, r.exact) for r in requests)
        running: list[_Running] = []
        clock = comp_total = mem_total = 0.0
        cached = iterations = retractions = finished = 0
        order: list[str] = []
        finished_order: list[str] = []
        decoded_total = peak_kv = 0
        steps: list[tuple[float, float, int]] = []
        record_every = max(1, sum(r.output_len for r in requests) // max(len(requests), 1) // 4 or 1)
        while finished < len(requests):
            admitted = self._admit(running, by_rid)
            order.extend(admitted)
            if not running:
                raise RuntimeError("the policy proposed nothing that fits while requests remain")
            prefilling = [slot for slot in running if slot.prefill_left > 0]
            decoding = [slot for slot in running if slot.prefill_left == 0]
            if prefilling or admitted:
                comp, mem, hits = self._mixed_step(prefilling, decoding)
                cached += hits
                repeat = 1
            else:
                repeat = self._decode_run_length(decoding)
                comp, mem = self._decode_steps(decoding, repeat)
            step_time = self.overlap(comp, mem) if repeat == 1 else self._bulk_time(decoding, repeat)
            clock += step_time
            comp_total += comp
            mem_total += mem
            iterations += repeat
            for slot in decoding:
                slot.decoded += repeat
                slot.private_kv += repeat
                self._kv_used += repeat
            if len(steps) < self.step_records and iterations % record_every < repeat:
                steps.append((comp / repeat, mem / repeat, len(running)))
            done = [slot for slot in decoding if slot.decoded >= slot.request.output_len]
            for slot in done:
                running.remove(slot)
                self._release(slot)
                self.policy.finished(slot.request.rid, slot.decoded)
                finished_order.append(slot.request.rid)
                decoded_total += slot.decoded
            finished += len(done)
            if progress and done:
                progress(len(done))
            for slot in decoding:
                if slot not in done:
                    self.policy.progress(slot.request.rid, slot.decoded)
            retractions += self._retract_if_over(running)
            peak_kv = max(peak_kv, self._kv_used)
        return SimResult(clock, sum(r.prompt_len for r in requests), sum(r.output_len for r in requests), cached,
                         comp_total, mem_total, iterations, retractions, order, finished_order, decoded_total,
                         peak_kv, steps)

    def _evictable(self) -> int:
        return sum(length for length, users in self._prefixes.values() if users == 0)

    def _evict(self, needed: int, keep: object = None) -> None:
        """Free unreferenced cached prefixes, least recently used first, until ``needed`` fits."""
        for key in list(self._prefixes):
            if self.capacity - self._kv_used >= needed:
                return
            length, users = self._prefixes[key]
            if users == 0 and key != keep:
                del self._prefixes[key]
                self._kv_used -= length

    def _reserved(self, slot: _Running) -> float:
        return (slot.request.output_len - slot.decoded) * self.new_token_ratio

    def _admit(self, running: list[_Running], by_rid: dict[str, SimRequest]) -> list[str]:
        reserve = sum(self._reserved(slot) for slot in running)
        free = self.capacity - self._kv_used + self._evictable() - reserve
        proposal = self.policy.propose(max(int(free), 0), self.max_running - len(running))
        taken: list[str] = []
        for offered in proposal:
            request = by_rid[offered.rid]
            resident = request.prefix_key in self._prefixes
            generated = self._generated.pop(request.rid, 0)
            need = request.prompt_len - (request.prefix_len if resident else 0) + generated + 1
            future = (request.output_len - generated) * self.new_token_ratio
            self._evict(need + reserve + future, keep=request.prefix_key)
            if self.capacity - self._kv_used < need + reserve + future and running:
                self._generated[request.rid] = generated
                break
            if request.prefix_key is not None:
                if resident:
                    self._prefixes.move_to_end(request.prefix_key)
                    self._prefixes[request.prefix_key][1] += 1
                else:
                    self._prefixes[request.prefix_key] = [request.prefix_len, 1]
                    self._kv_used += request.prefix_len
            slot = _Running(request, request.prompt_len, decoded=generated,
                            prefix_hit=request.prefix_len if resident else 0)
            slot.prefill_left = request.prompt_len + generated - slot.prefix_hit
            private = request.prompt_len + generated - (request.prefix_len if request.prefix_key is not None else 0)
            slot.private_kv = private
            self._kv_used += private
            reserve += future
            running.append(slot)
            taken.append(request.rid)
        self.policy.admitted(taken)
        return taken

    def _mixed_step(self, prefilling: list[_Running], decoding: list[_Running]) -> tuple[float, float, int]:
        paced = self.policy.prefill_token_budget()
        budget = min(self.chunk_tokens, paced) if paced is not None else max(self.chunk_tokens - len(decoding), 0)
        comp = len(decoding) * self._flops_per_token
        hits = 0
        for slot in prefilling:
            if budget <= 0:
                break
            total = slot.request.prompt_len + slot.decoded
            if slot.prefill_left == total - slot.prefix_hit:
                hits += slot.prefix_hit
            chunk = min(slot.prefill_left, budget)
            done_before = total - slot.prefill_left
            comp += chunk * self._flops_per_token + self._attn * chunk * (done_before + chunk / 2)
            slot.prefill_left -= chunk
            budget -= chunk
        mem = sum(slot.request.prompt_len + slot.decoded for slot in decoding) * self._kv_read
        return comp, mem, hits

    def _decode_run_length(self, decoding: list[_Running]) -> int:
        """Steps until the first decoding request finishes or KV would run out."""
        until_finish = min(slot.request.output_len - slot.decoded for slot in decoding)
        room = (self.capacity - self._kv_used) // max(len(decoding), 1)
        return max(1, min(until_finish, room))

    def _decode_steps(self, decoding: list[_Running], repeat: int) -> tuple[float, float]:
        n = len(decoding)
        context = sum(slot.request.prompt_len + slot.decoded for slot in decoding)
        comp = repeat * n * self._flops_per_token
        mem = (repeat * context + n * repeat * (repeat - 1) / 2) * self._kv_read
        return comp, mem

    def _bulk_time(self, decoding: list[_Running], repeat: int) -> float:
        n = len(decoding)
        context = sum(slot.request.prompt_len + slot.decoded for slot in decoding)
        comp = np.full(repeat, n * self._flops_per_token)
        mem = (context + n * np.arange(repeat)) * self._kv_read
        return float(np.sum(self.overlap.vector(comp, mem)))

    def _release(self, slot: _Running) -> None:
        self._kv_used -= slot.private_kv
        key = slot.request.prefix_key
        if key is not None and key in self._prefixes:
            self._prefixes[key][1] -= 1

    def _retract_if_over(self, running: list[_Running]) -> int:
        retracted = 0
        while self._kv_used > self.capacity and len(running) > 1:
            self._evict(self._kv_used - self.capacity)
            if self._kv_used <= self.capacity:
                break
            slot = running.pop()
            self._release(slot)
            self._generated[slot.request.rid] = slot.decoded
            self.policy.preempted(slot.request.rid)
            retracted += 1
        return retracted
