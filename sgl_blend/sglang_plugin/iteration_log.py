"""The scheduler's per-iteration record: what each forward batch ran and how long it took.

One record per batch SGLang runs, keyed by its ``forward_iter``: the batch's `BatchShape` (what
the latency models read), how many online and offline requests it prefilled and decoded, the
forward time (``forward_s``, `run_batch`) and the launch-to-launch period of the scheduler loop
(``period_s``: the previous batch's forward plus the scheduling and result processing around
it, absent after the engine was idle; SGLang overlaps result processing with the next forward,
so a batch's own end-to-end time is not a quantity the loop has). Online requests are also
followed from arrival -- the iteration count when SGLang queued them -- to the first batch that
ran them, so "admitted in the next iteration" is checked in iterations, not seconds; the batch
that admits them also records when the scheduler received each (``online_received``, wall clock),
and the batch that completes a request's prompt -- the admitting one, or a later one for a prompt
prefilled in chunks -- records that receipt again (``online_prefilled``): the batch whose end is the
request's first token. Together they split a client's time to first token into the way to the
scheduler, the scheduler's part and the way back.

The last records are published in ``/server_info``; with the settings' ``iteration_log`` set,
every record is also appended to that JSONL file (what `sgl-blend profile --latency` fits on).
On a CPU the forward is synchronous; on a GPU the timer synchronises the device first.
"""

from __future__ import annotations

import json
import time
from collections import deque
from typing import Any, TextIO

from sgl_blend.core.latency_model import BatchShape
from sgl_blend.offline import is_offline

KEPT_RECORDS = 256
MAX_TRACKED_ARRIVALS = 4096


def batch_composition(batch: Any) -> tuple[BatchShape, dict[str, int]]:
    """The shape of a SGLang `ScheduleBatch` and its online/offline prefill/decode counts."""
    counts = {"online_prefill": 0, "online_decode": 0, "offline_prefill": 0, "offline_decode": 0}
    reqs = batch.reqs
    if batch.forward_mode.is_decode():
        seq_lens = (
            batch.seq_lens_cpu.tolist()
            if batch.seq_lens_cpu is not None
            else [len(req.origin_input_ids) + len(req.output_ids) for req in reqs]
        )
        offline = sum(1 for req in reqs if is_offline(req.routing_key))
        counts["offline_decode"], counts["online_decode"] = offline, len(reqs) - offline
        return BatchShape.of((), [int(context) for context in seq_lens]), counts
    decoding = _mixed_decodes(batch)
    extends, contexts = [], []
    for req, extend, prefix in zip(reqs, batch.extend_lens, batch.prefix_lens):
        if id(req) in decoding:
            contexts.append(int(prefix) + 1)
            counts[_kind(req) + "_decode"] += 1
        else:
            extends.append((int(extend), int(prefix)))
            counts[_kind(req) + "_prefill"] += 1
    return BatchShape.of(extends, contexts), counts


def _mixed_decodes(batch: Any) -> set[int]:
    """Ids of the requests an extend batch decodes (a mixed batch's; none otherwise)."""
    return {id(req) for req in (batch.decoding_reqs or ())} if batch.forward_mode.is_mixed() else set()


def _online_extends(batch: Any) -> list[tuple[Any, int]]:
    """The online requests ``batch`` prefills, each with the tokens its sequence will then hold."""
    if batch.forward_mode.is_decode():
        return []
    decoding = _mixed_decodes(batch)
    return [
        (req, int(prefix) + int(extend))
        for req, extend, prefix in zip(batch.reqs, batch.extend_lens, batch.prefix_lens)
        if id(req) not in decoding and not is_offline(req.routing_key)
    ]


def _bound(tracked: dict[str, Any]) -> None:
    """Requests aborted before they ran (or before their prompt was prefilled) are dropped oldest
    first past a bound."""
    if len(tracked) > MAX_TRACKED_ARRIVALS:
        del tracked[next(iter(tracked))]


def _synchronize_device() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _kind(req: Any) -> str:
    return "offline" if is_offline(req.routing_key) else "online"


class IterationRecorder:
    def __init__(self, log_path: str | None = None) -> None:
        self.records: deque[dict[str, Any]] = deque(maxlen=KEPT_RECORDS)
        self.admissions: deque[dict[str, Any]] = deque(maxlen=KEPT_RECORDS)
        # rid -> (batches run before it was queued, wall time it was queued)
        self._arrived: dict[str, tuple[int, float]] = {}
        # rid -> wall time it was queued, for an online prompt admitted and not yet fully prefilled
        self._prefilling: dict[str, float] = {}
        self._open: dict[str, Any] | None = None
        self._last_launch: float | None = None
        self._log: TextIO | None = open(log_path, "a") if log_path else None
        self.plan_summary: dict[str, Any] = {}

    def idle(self) -> None:
        """The engine has nothing to run: the next launch starts no period (idle time is not an
        iteration's)."""
        self._last_launch = None

    def arrived(self, rid: str, iterations_so_far: int) -> None:
        """An online request entered the waiting queue after ``iterations_so_far`` batches."""
        self._arrived.setdefault(rid, (iterations_so_far, time.time()))
        _bound(self._arrived)

    def begin(self, batch: Any, iteration: int, plugin_s: float = 0.0) -> None:
        """Before the forward; ``iteration`` is the number SGLang is about to give the batch,
        ``plugin_s`` the plugin's own time in the loop since the last launch (`plugin_time`)."""
        shape, counts = batch_composition(batch)
        record: dict[str, Any] = {
            "iteration": iteration,
            "plugin_s": round(plugin_s, 6),
            "mode": batch.forward_mode.name.lower(),
            **shape.to_dict(),
            **counts,
            **self.plan_summary,
        }
        admitted, prefilled = [], []
        for req, extended in _online_extends(batch):
            arrival = self._arrived.pop(req.rid, None)
            if arrival is not None:
                iterations, received = arrival
                scheduled = record["iteration"]
                admitted.append(
                    {"rid": req.rid, "arrived_after": iterations, "scheduled_in": scheduled, "received": received}
                )
                self._prefilling[req.rid] = received
                _bound(self._prefilling)
            if extended >= len(req.origin_input_ids) + len(req.output_ids) and req.rid in self._prefilling:
                prefilled.append(round(self._prefilling.pop(req.rid), 4))
        if admitted:
            record["online_admitted"] = len(admitted)
            record["online_received"] = [round(admission["received"], 4) for admission in admitted]
            self.admissions.extend(admitted)
        if prefilled:
            record["online_prefilled"] = prefilled
        now = time.perf_counter()
        if self._last_launch is not None:
            record["period_s"] = round(now - self._last_launch, 6)
        self._last_launch = now
        self._open = record

    def forward_done(self) -> dict[str, Any] | None:
        """Close the batch's record; returns it."""
        record, self._open = self._open, None
        if record is None:
            return None
        assert self._last_launch is not None, "set with the record it closes"
        _synchronize_device()
        record["forward_s"] = round(time.perf_counter() - self._last_launch, 6)
        record["wall"] = round(time.time(), 3)
        self.records.append(record)
        if self._log is not None:
            self._log.write(json.dumps(record) + "\n")
            self._log.flush()
        return record

    def snapshot(self) -> dict[str, Any]:
        return {"iterations": list(self.records), "online_admissions": list(self.admissions)}
