"""Echo's plan generator and selector (Echo §3.1 Eq. 1-4, §4.1): each iteration's offline work, chosen
by benefit minus punishment per unit of time.

Echo does not search the exponential space of batches. It starts from the last batch and makes
minor adjustments -- preempt an offline request, schedule a prefill, schedule an offline decode
whose KV is resident -- and among the candidates for an adjustment it takes the best one by
``(Benefit - Punishment) / Time`` (Eq. 4). Online work is never an adjustment: it is charged to the
iteration first, in arrival order, and never cut.

How the paper's terms read here (one reading, used everywhere):

- **Benefit** (Eq. 1) counts one per token a request advances by this iteration: each token it
  computes (prompt, recomputed prompt, or decode) and -- the first time a request is admitted --
  each prompt token it finds resident in the prefix cache, which it gets without computing it.
  That last part is what makes Echo schedule requests that share resident KV (its Fig. 4b): a
  candidate on a resident prefix yields its whole prompt for the time of its tail. It is also how
  offline throughput is counted (prompt tokens once, output tokens once). A request coming back
  (parked, preempted, or a chunked prefill sent back) is not credited again for its own KV.
- **Punishment** (Eq. 2) counts the KV tokens an adjustment gives up that will be needed again,
  that is, their recomputation. Preempting an unfinished offline request gives up its context,
  except the tokens another lock still covers (another running request on the same prefix, or a
  parked request's pin), which stay resident. Parking a decode gives up nothing: its KV stays
  resident for its return. Admissions are bounded by the offline memory (HyGen's Alg. 2 with
  Echo's online reserve); what they make the cache evict is ordered by Echo's KV priorities
  (`kv_priority`) and is not priced here.
- **Time** is the latency model's prediction for the whole batch (`IterationBudget`), and the
  deadline -- Echo's SLO ``min_r(TTFT + i·TPOT - waited)``, capped by the TBT target and never
  below the online part (`state_budget.echo_budget`) -- is a hard constraint, as Eq. 3 states it:
  an adjustment whose predicted batch breaks it is infeasible, never traded against benefit.

The selector, per iteration:

1. The last batch's offline decodes -- with the decodes parked before, which the engine holds
   with their KV resident -- stay unless memory or the deadline forces them out. When
   online demand leaves a memory deficit, offline requests are preempted at the least punishment
   (`preempt_for_memory`). When the deadline cannot carry every decode, those whose marginal time
   is largest are parked: each keeps one token of benefit for its marginal time, so the cheapest
   decodes are the best ratio (`keep_decodes`).
2. Then prefills, one at a time (`add_prefills`): among the candidates -- waiting offline
   requests, fresh ones and returning ones (a request sent back to the queue -- preempted, or a
   decode the engine could not hold -- comes back as a prefill of what the cache no longer holds)
   -- the feasible whole-prompt admission with the best marginal
   ``benefit / Δtime``, until none fits; then at most one truncated chunk (SGLang carries one
   chunked request at a time), and the selection stops. Every admission adds benefit, so
   "nothing improves" is "nothing fits".

Cost: each step predicts once per candidate, so a selection is O(window × admissions)
predictions; the window (`CANDIDATE_WINDOW`) is the first candidates in the offline policy's
order, which already ranks the pool (prefix-sharing DFS keeps sharers adjacent).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sgl_blend.core.iteration_budget import IterationBudget, RunningRequest
from sgl_blend.core.latency_model import Predictor

# How many candidates, in the offline policy's order, the selector weighs per iteration (in the
# engine each is also matched against the radix cache every prefill iteration). Measured with
# `python -m bench.echo_window` (bench/results/echo_window.md: Llama-3.1-8B/H100 simulator, Echo
# deadlines, few-shot and long-document requests alternating): with PSM order the offline
# throughput levels off by 8 (175.0k tok/s at window 1, 187.9k from 8 to 64), and 16 keeps the
# selector's P99 near half of BROS's 10% bound on scheduler overhead per iteration (0.54-0.79 ms of
# a 12.1-12.4 ms simulated iteration over two runs on this shared CPU), where 32 reaches the bound
# (1.19-1.35 ms). Under FCFS a wider window keeps gaining (80.7k at 16, 85.7k at 64) by taking
# few-shot questions further past long documents.
CANDIDATE_WINDOW = 16
# Marginal times at or below this are taken as free work (Echo's mixed-batch form can hide a small
# prefill under the decodes); it only keeps the ratio finite.
MIN_MARGINAL_S = 1e-9

KEEP_DECODE = "keep_decode"
PARK_DECODE = "park_decode"
PREEMPT = "preempt"
ADD_PREFILL = "add_prefill"
ADD_RESUME = "add_resume"


@dataclass(frozen=True, slots=True)
class OfflineCandidate:
    """A waiting offline request the selector may admit. ``extend`` is what it must compute (its
    prompt and any output past ``prefix``, the resident cached tokens it reuses); ``fresh`` is
    False for a request admitted before; ``reusers`` is how many other pending offline requests
    share its resident prefix (Echo's rc), which breaks ties toward keeping that prefix in use."""

    rid: str
    extend: int
    prefix: int
    max_new_tokens: int
    fresh: bool = True
    reusers: int = 0

    def benefit(self, chunk: int) -> int:
        return chunk + (self.prefix if self.fresh else 0)


@dataclass(frozen=True, slots=True)
class Adjustment:
    """One change to the last batch: ``tokens`` is the prefill chunk admitted (``truncated`` when
    it is less than the request's remaining prompt), or the context of a decode kept, parked or
    preempted; ``seconds`` is its marginal predicted time (None: no model to predict with)."""

    kind: str
    rid: str
    tokens: int
    benefit: int = 0
    punishment: int = 0
    seconds: float | None = None
    truncated: bool = False


@dataclass
class EchoChoices:
    """The selector's decisions for one iteration. ``admit`` is the prefill selection in its order
    (rid to chunk), None until the selector has seen the candidates; ``predicted_s`` the predicted
    time of the batch it chose."""

    adjustments: list[Adjustment] = field(default_factory=list)
    admit: dict[str, int] | None = None
    candidates: int = 0
    predicted_s: float | None = None

    def counts(self) -> Counter[str]:
        return Counter(adjustment.kind for adjustment in self.adjustments)

    def summary(self) -> dict[str, Any]:
        benefit = sum(adjustment.benefit for adjustment in self.adjustments)
        punishment = sum(adjustment.punishment for adjustment in self.adjustments)
        rate = (benefit - punishment) / self.predicted_s if self.predicted_s else None
        return {
            "adjustments": dict(self.counts()),
            "candidates": self.candidates,
            "benefit": benefit,
            "punishment": punishment,
            "truncated": sum(1 for a in self.adjustments if a.truncated),
            "predicted_s": round(self.predicted_s, 6) if self.predicted_s is not None else None,
            "benefit_per_s": round(rate, 1) if rate is not None else None,
        }


def preemption_punishment(request: RunningRequest) -> int:
    """The recomputation a preemption causes: the request is unfinished, so all of its context is
    needed again, except what another lock keeps resident."""
    return max(request.context - request.shared, 0)


def _freed(request: RunningRequest) -> int:
    return request.context + request.reserved


def preempt_for_memory(offline: Sequence[RunningRequest], deficit: int) -> list[Adjustment]:
    """Preemptions that give back ``deficit`` KV tokens at the least punishment: when one request
    alone frees enough, the least punished of those that do; otherwise the one that frees the most
    per token punished, and again for what is still short. Freed memory is counted as the offline
    budget counts it (context plus decode reserve)."""
    chosen: list[Adjustment] = []
    left = list(offline)
    while deficit > 0 and left:
        covering = [request for request in left if _freed(request) >= deficit]
        if covering:
            victim = min(covering, key=lambda r: (preemption_punishment(r), -_freed(r)))
        else:
            victim = min(left, key=lambda r: (preemption_punishment(r) / max(_freed(r), 1), preemption_punishment(r)))
        left.remove(victim)
        deficit -= _freed(victim)
        chosen.append(Adjustment(PREEMPT, victim.rid, victim.context, punishment=preemption_punishment(victim)))
    return chosen


def keep_decodes(budget: IterationBudget, offline: Sequence[RunningRequest]) -> list[Adjustment]:
    """Keep the last batch's offline decodes within the deadline, cheapest marginal time first;
    the rest are parked (their KV stays resident). When all of them fit, one prediction says so;
    otherwise each decode's marginal time is measured against the batch before any offline decode,
    so the order needs no assumption on the model's form."""
    if budget.try_offline_decodes([request.context for request in offline]):
        return [Adjustment(KEEP_DECODE, request.rid, request.context, benefit=1) for request in offline]
    model = budget.model
    assert model is not None, "without a model every decode fits, and try_offline_decodes said so"
    base_batch = budget.batch
    base = model.predict(base_batch)
    marginal = {request.rid: model.predict(base_batch.with_decode(request.context)) - base for request in offline}
    adjustments = []
    for request in sorted(offline, key=lambda r: marginal[r.rid]):
        if budget.try_offline_decode(request.context):
            adjustments.append(Adjustment(KEEP_DECODE, request.rid, request.context, 1, 0, marginal[request.rid]))
        else:
            adjustments.append(Adjustment(PARK_DECODE, request.rid, request.context, 0, 0, -marginal[request.rid]))
    return adjustments


def add_prefills(
    budget: IterationBudget,
    model: Predictor | None,
    candidates: Sequence[OfflineCandidate],
    *,
    truncate: bool,
    window: int = CANDIDATE_WINDOW,
) -> list[Adjustment]:
    """Admit candidates into ``budget`` (which is charged), best marginal ``benefit / Δtime``
    first, while a whole remaining prompt fits; then, if ``truncate``, one chunk of the best-ranked
    candidate that still gets one. ``model`` prices the ratio (it may be the budget's own, or the
    controller's when the iteration has no time cap); without one, benefit per computed token.
    Ties go to more reusers of the resident prefix, then to the policy's order. Only the first
    ``window`` candidates are weighed."""
    pending = list(candidates[:window])
    chosen: list[Adjustment] = []
    ranked: list[tuple[float, int, int, OfflineCandidate, float | None]] = []
    while pending:
        base = model.predict(budget.batch) if model is not None else 0.0
        ranked = []
        for position, candidate in enumerate(pending):
            seconds = _marginal_s(model, budget, base, candidate.extend, candidate.prefix)
            ratio = candidate.benefit(candidate.extend) / (
                max(seconds, MIN_MARGINAL_S) if seconds is not None else max(candidate.extend, 1)
            )
            ranked.append((-ratio, -candidate.reusers, position, candidate, seconds))
        ranked.sort(key=lambda entry: entry[:3])
        fitting = next(
            (
                entry
                for entry in ranked
                if budget.fits_prefill(entry[3].extend, entry[3].prefix, entry[3].max_new_tokens)
            ),
            None,
        )
        if fitting is None:
            break
        candidate, seconds = fitting[3], fitting[4]
        budget.commit_offline_prefill(candidate.extend, candidate.prefix, True, candidate.max_new_tokens)
        chosen.append(_admission(candidate, candidate.extend, seconds))
        pending.remove(candidate)
    if truncate and pending:
        for _, _, _, candidate, _ in ranked:
            if not budget.minimal_chunk_fits(candidate.extend, candidate.prefix):
                continue
            chunk = budget.offline_chunk(candidate.extend, candidate.prefix, candidate.max_new_tokens)
            if chunk > 0:
                base = model.predict(budget.batch) if model is not None else 0.0
                seconds = _marginal_s(model, budget, base, chunk, candidate.prefix)
                budget.commit_offline_prefill(
                    chunk, candidate.prefix, chunk == candidate.extend, candidate.max_new_tokens
                )
                chosen.append(_admission(candidate, chunk, seconds))
                break
    return chosen


def _marginal_s(
    model: Predictor | None, budget: IterationBudget, base: float, extend: int, prefix: int
) -> float | None:
    return model.predict(budget.batch.with_prefill(extend, prefix)) - base if model is not None else None


def _admission(candidate: OfflineCandidate, chunk: int, seconds: float | None) -> Adjustment:
    return Adjustment(
        ADD_PREFILL if candidate.fresh else ADD_RESUME,
        candidate.rid,
        chunk,
        benefit=candidate.benefit(chunk),
        seconds=seconds,
        truncated=chunk < candidate.extend,
    )
