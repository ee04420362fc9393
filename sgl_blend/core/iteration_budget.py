"""One iteration's budget -- residual time, chunk room, offline memory -- and the running requests it is spent on.

HyGen's controller (`colocation`) and Echo's selector (`echo_plan`) both spend an
`IterationBudget` on the same `RunningRequest`s; the controller also calls the selector. The budget
lives here, below both, so that the selector needs nothing of the controller.

An iteration with nothing in it always takes one unit of offline work -- one decode, or one
prompt chunk of at most ``min_offline_chunk`` tokens -- whatever the time budget says. Nothing
online is in such an iteration to protect, and an empty one never ends: no forward runs, so
neither the calibration that priced the unit over the budget nor the state can change, and a
scheduler with nothing to run sleeps until a new request arrives. On the emulated H100 the
calibration learned the 2-core host's ~7.5 ms period floor from small batches (ratio 2.8 to the
fitted model); HyGen's 8 ms budget then priced a single decode above itself, and the batch
stopped for 18-24 s, until an online request arrived (docs/colocation-history.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sgl_blend.core.host_gap import HostTime
from sgl_blend.core.latency_model import BatchShape, LatencyModel, Predictor, max_prefill

DEFAULT_MIN_OFFLINE_CHUNK = 16


@dataclass(slots=True)
class RunningRequest:
    """A request that decodes this iteration. ``reserved`` is the KV it may still add; ``shared``
    the part of its context another lock also covers (another running request on the same prefix,
    a parked request's pin), which stays resident if this one is preempted (Echo's punishment)."""

    rid: str
    online: bool
    context: int
    reserved: int = 0
    arrival: float = 0.0
    output_tokens: int = 0
    shared: int = 0


@dataclass(frozen=True)
class ScaledModel:
    """A fitted model whose predictions are multiplied by the engine's recent measured/predicted
    ratio: the fit describes the machine as profiled, the scale follows it as it is now (a
    shared CPU slows down and speeds up with its neighbours). With ``host``, a batch takes at
    least the host's time for its requests: SGLang hands the device its next batch only when the
    host has built it, so on a host that falls behind the period is the host's, whatever the
    device would need."""

    model: LatencyModel
    scale: float
    host: HostTime | None = None

    def predict(self, shape: BatchShape) -> float:
        device_s = self.scale * self.model.predict(shape)
        return device_s if self.host is None else max(device_s, self.host.seconds(shape.requests))


class IterationBudget:
    """One iteration's residual time, chunk room and offline memory, spent online first.

    ``batch`` is the predicted forward batch so far; ``decodes`` is the decode-only batch that
    follows once every admitted prefill has become a decode, so admitting an offline request
    never creates a decode iteration the budget would have to skip again.
    """

    def __init__(
        self,
        model: Predictor | None,
        latency_s: float | None,
        chunk_tokens: int | None,
        offline_memory: int | None,
        min_offline_chunk: int = DEFAULT_MIN_OFFLINE_CHUNK,
    ) -> None:
        self.model = model if latency_s is not None else None
        self.latency_s = latency_s
        # what a prediction is held to: read only while ``model`` is set, which takes a latency_s
        self.limit_s = latency_s if latency_s is not None else math.inf
        self.chunk_left = chunk_tokens
        self.offline_memory = offline_memory
        self.min_offline_chunk = min_offline_chunk
        self.batch = BatchShape()
        self.decodes = BatchShape()
        self.offline_prefill_tokens = 0

    def _charge_chunk(self, tokens: int) -> None:
        if self.chunk_left is not None:
            self.chunk_left -= tokens

    def add_online_decode(self, context: int) -> None:
        if self.model is not None:
            self.batch = self.batch.with_decode(context)
            self.decodes = self.decodes.with_decode(context + 1)
        self._charge_chunk(1)

    def add_online_prefill(self, extend: int, prefix: int = 0) -> None:
        self.batch = self.batch.with_prefill(extend, prefix)
        self.decodes = self.decodes.with_decode(prefix + extend)
        self._charge_chunk(extend)

    def _first_unit(self, before: BatchShape, after: BatchShape) -> bool:
        """Whether ``after`` is ``before``, empty, with one decode or one minimal chunk added: the
        unit an empty iteration always takes (module docstring)."""
        return before.requests == 0 and after.requests == 1 and after.prefill_tokens <= self.min_offline_chunk

    def _fits(self, before: BatchShape, after: BatchShape) -> bool:
        """Whether growing ``before`` to ``after`` stays within the time budget (an empty
        iteration's first unit always does). Read only with a model."""
        assert self.model is not None, "the shapes are priced only under a time budget"
        return self._first_unit(before, after) or self.model.predict(after) <= self.limit_s

    def try_offline_decode(self, context: int) -> bool:
        """Keep an offline decode if the batch still fits; its KV is already resident. Without a time
        budget nothing reads the shapes, so they are not built (a scheduler calls this for every
        running request, every iteration)."""
        if self.model is None:
            self._charge_chunk(1)
            return True
        batch = self.batch.with_decode(context)
        if not self._fits(self.batch, batch):
            return False
        self.batch = batch
        self.decodes = self.decodes.with_decode(context + 1)
        self._charge_chunk(1)
        return True

    def try_offline_decodes(self, contexts: Sequence[int]) -> bool:
        """Keep all these offline decodes if the batch with every one of them fits, on one
        prediction; otherwise change nothing."""
        if self.model is None:
            self._charge_chunk(len(contexts))
            return True
        batch, decodes = self.batch, self.decodes
        for context in contexts:
            batch = batch.with_decode(context)
            decodes = decodes.with_decode(context + 1)
        if not self._fits(self.batch, batch):
            return False
        self.batch, self.decodes = batch, decodes
        self._charge_chunk(len(contexts))
        return True

    def fits_prefill(self, extend: int, prefix: int, max_new_tokens: int) -> bool:
        """Whether a whole remaining prompt fits now: chunk room, offline memory for it and its
        decodes, and the time budget for this batch and for the decode iteration that follows."""
        if (self.chunk_left is not None and extend > self.chunk_left) or (
            self.offline_memory is not None and extend + max_new_tokens > self.offline_memory
        ):
            return False
        if self.model is None:
            return True
        return self._fits(self.batch, self.batch.with_prefill(extend, prefix)) and self._fits(
            self.decodes, self.decodes.with_decode(prefix + extend)
        )

    def minimal_chunk_fits(self, extend: int, prefix: int) -> bool:
        """Whether the smallest chunk of a prompt fits the time left: one prediction, where
        `offline_chunk` bisects (a selector asks it of every candidate once the time is spent)."""
        if self.model is None:
            return True
        return self._fits(self.batch, self.batch.with_prefill(min(extend, self.min_offline_chunk), prefix))

    def offline_chunk(self, extend: int, prefix: int, max_new_tokens: int, *, must_progress: bool = False) -> int:
        """The prefill chunk an offline request may run now (0: none). ``must_progress`` is for a
        chunked prefill already under way, which the engine cannot pause: it gets at least one
        minimal chunk."""
        floor = min(extend, self.min_offline_chunk)
        chunk_room = extend if self.chunk_left is None else self.chunk_left
        memory_room = extend if self.offline_memory is None else self.offline_memory - max_new_tokens
        if self.model is None:
            chunk = max(0, min(extend, chunk_room, memory_room))
        else:
            chunk, _ = max_prefill(self.model, self.limit_s, self.batch, extend, prefix, chunk_room, memory_room)
            if chunk < floor and self._first_unit(self.batch, self.batch.with_prefill(floor, prefix)):
                chunk = max(0, min(floor, chunk_room, memory_room))
            if chunk == extend and not self._fits(self.decodes, self.decodes.with_decode(prefix + extend)):
                chunk = 0
        if must_progress:
            return max(chunk, floor)
        return chunk if chunk >= floor else 0

    def commit_offline_prefill(self, chunk: int, prefix: int, finishes_prompt: bool, max_new_tokens: int) -> None:
        self.batch = self.batch.with_prefill(chunk, prefix)
        if finishes_prompt:
            self.decodes = self.decodes.with_decode(prefix + chunk)
        self._charge_chunk(chunk)
        self.offline_prefill_tokens += chunk
        if self.offline_memory is not None:
            self.offline_memory -= chunk + (max_new_tokens if finishes_prompt else 0)

    def free_offline_memory(self, tokens: int) -> None:
        """Give offline work back ``tokens`` of KV (a preempted request's, a parked decode's pin);
        nothing changes without a memory cap."""
        if self.offline_memory is not None:
            self.offline_memory += tokens

    def predicted_s(self) -> float | None:
        return self.model.predict(self.batch) if self.model is not None else None

    def model_s(self) -> float | None:
        """The prediction before calibration, which the calibration itself learns from."""
        model = self.model.model if isinstance(self.model, ScaledModel) else self.model
        return model.predict(self.batch) if model is not None else None
