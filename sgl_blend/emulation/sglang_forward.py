"""Where the emulated GPU enters SGLang: the hooks around the model forward.

The forward is replaced at ``TpModelWorker.forward_batch_generation``, the one call the scheduler
makes per forward (``Scheduler.run_batch``). Everything before it -- admission, the radix-cache
match, KV allocation, chunking, mixing running decodes into a prefill, retraction -- and everything
after it -- ``process_batch_result``, the radix-cache insert, finishing, the detokenizer -- is
SGLang's own code running for real. In between, a skipped forward returns the emulated token for
every request, which is all the scheduler reads from a plain generation batch, and writes no KV
(the slots SGLang allocated are never read). A batch that asks for more than tokens (logprobs,
hidden states, a grammar) runs the stand-in model for real so its answer has every field SGLang
fills -- its values are the stand-in's over KV the skipped forwards never wrote -- and is priced
the same. Each forward is priced from the batch's own lengths (`pricing`), and the clock (`clock`)
is reported in ``/server_info``. With a real-time factor (`EmulationConfig.realtime_factor`) the
forward also lasts its price on the wall clock, stretched by that factor (`realtime`).

Every SGLang internal this touches is a row of the plugin's boundary table
(`sgl_blend.sglang_plugin.sglang_boundary`: ``EMULATED_FORWARD``, ``EMULATION_NO_BATCH``,
``GET_INTERNAL_STATE``, the ``scheduled`` batch's attributes, the two result classes), which the
plugin checks against the installed SGLang before anything registers. The plugin passes that module
in (`Boundary`): it imports this package for `EmulationConfig`, so this package cannot import it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from sgl_blend.core.latency_model import BatchShape
from sgl_blend.emulation.clock import DeviceClock
from sgl_blend.emulation.config import EMULATION_KEY, STATE_KEY, EmulationConfig
from sgl_blend.emulation.devices import resolve_device
from sgl_blend.emulation.pricing import DECODE, MIXED, PREFILL, ForwardPricer, batch_shape
from sgl_blend.emulation.realtime import RealTimePacer
from sgl_blend.offline import is_offline

logger = logging.getLogger(__name__)

# ForwardMode names the emulation prices; any other forward (speculative, disaggregated, DP idle)
# runs as SGLang runs it, unpriced.
KIND_BY_MODE = {"EXTEND": PREFILL, "DECODE": DECODE, "MIXED": MIXED}


class Boundary(Protocol):
    """What the emulation uses of the plugin's SGLang boundary (the ``sglang_boundary`` module)."""

    EMULATED_FORWARD: Any
    EMULATION_NO_BATCH: Any
    GET_INTERNAL_STATE: Any

    def register_hook(self, hook: Any, function: Callable[..., Any]) -> None: ...

    def argument(self, call: Any, name: str) -> Any: ...

    def __getattr__(self, name: str) -> Any:
        """SGLang's classes by name (``GenerationBatchResult``, ``LogitsProcessorOutput``), which the
        module imports on first use."""


def read_batch(scheduled: Any) -> tuple[str, BatchShape] | None:
    """The kind and shape of the forward SGLang is about to run; None for a forward not priced.

    A prefill row extends a request by ``extend_lens[i]`` tokens on ``prefix_lens[i]`` cached
    ones; a decode row attends to its whole sequence. In a mixed batch SGLang appends the running
    decodes after the prefill rows (``mix_with_running``), as many as ``mix_running_indices_cpu``.
    """
    kind = KIND_BY_MODE.get(getattr(getattr(scheduled, "forward_mode", None), "name", ""))
    if kind is None:
        return None
    if kind == DECODE:
        lengths = scheduled.seq_lens_cpu if scheduled.seq_lens_cpu is not None else scheduled.seq_lens
        return kind, batch_shape(decode_contexts=[int(length) for length in lengths.tolist()])
    rows = list(zip(scheduled.extend_lens, scheduled.prefix_lens))
    decodes = len(scheduled.mix_running_indices_cpu) if kind == MIXED else 0
    prefills = rows[: len(rows) - decodes]
    return kind, batch_shape(prefills, [extend + prefix for extend, prefix in rows[len(prefills) :]])


def needs_model_outputs(scheduled: Any) -> bool:
    """Whether the batch asks for more than the next tokens, which only a real forward gives."""
    sampling = scheduled.sampling_info
    return bool(
        scheduled.return_logprob
        or scheduled.return_hidden_states
        or (sampling is not None and sampling.grammars is not None)
    )


class Emulator:
    """The scheduler process's emulated device: prices forwards, keeps the clock, reports it."""

    def __init__(self, config: EmulationConfig, boundary: Boundary) -> None:
        self.config = config
        self.boundary = boundary
        self.pricer = ForwardPricer.of(resolve_device(config.device), config.model, config.tp)
        self.clock = DeviceClock()
        self.pacer = RealTimePacer(config.realtime_factor) if config.realtime_factor is not None else None
        # The clock (and the pacer's lateness) when the first forward with offline work began: a
        # job on a fresh server starts there, not with the server's start-up or a health check.
        self.job_start: dict[str, Any] | None = None
        self._batch = boundary.argument(boundary.EMULATED_FORWARD, "batch")

    def forward(self, original: Callable[..., Any], worker: Any, *args: Any, **kwargs: Any) -> Any:
        scheduled = self._batch.read((worker, *args), kwargs)
        priced = read_batch(scheduled)
        if priced is None:
            return original(worker, *args, **kwargs)
        kind, shape = priced
        self.clock.busy()
        if self.job_start is None and any(is_offline(req.routing_key) for req in scheduled.reqs):
            self.job_start = {
                "device_seconds": self.clock.device_seconds,
                "idle_wall_seconds": self.clock.idle_wall_seconds,
                "realtime": self.pacer.state() if self.pacer is not None else None,
            }
        seconds = self.pricer.seconds(shape)
        if self.config.runs_model:
            started = time.perf_counter()
            result = original(worker, *args, **kwargs)
            self.clock.forward(kind, shape, seconds, time.perf_counter() - started)
            return result
        result = original(worker, *args, **kwargs) if needs_model_outputs(scheduled) else self.skipped(scheduled)
        self.clock.forward(kind, shape, seconds)
        if self.pacer is not None:
            self.pacer.run(seconds)
        return result

    def skipped(self, scheduled: Any) -> Any:
        """What the forward returns when it computes nothing: the emulated token for every request."""
        import torch

        token_id = self.config.token_id
        assert token_id is not None, "EmulationConfig requires one wherever forwards are skipped"
        tokens = torch.full((len(scheduled.reqs),), token_id, dtype=torch.int64, device=scheduled.device)
        return self.boundary.GenerationBatchResult(
            logits_output=self.boundary.LogitsProcessorOutput(next_token_logits=None), next_token_ids=tokens
        )

    def no_batch(self, *_args: Any, **_kwargs: Any) -> None:
        self.clock.idle()
        if self.pacer is not None:
            self.pacer.idle()

    def report(self, result: Any, *_args: Any, **_kwargs: Any) -> Any:
        result.internal_state.setdefault(STATE_KEY, {})[EMULATION_KEY] = self.state()
        return result

    def state(self) -> dict[str, Any]:
        return {
            "device": self.config.device,
            "hardware": self.pricer.hardware_name,
            "model": self.config.model,
            "model_shape": self.pricer.model.name,
            "tp": self.config.tp,
            "real_forward": self.config.runs_model,
            "token_id": self.config.token_id,
            **self.clock.state(),
            "wall_per_device_second": self.config.realtime_factor or 1.0,
            "realtime": self.pacer.state() if self.pacer is not None else None,
            "job_start": self.job_start,
        }


def register(config: EmulationConfig | None, boundary: Boundary) -> None:
    """Hook the emulated device into this SGLang process, when the launcher asked for one."""
    if config is None:
        return
    emulator = Emulator(config, boundary)
    boundary.register_hook(boundary.EMULATED_FORWARD, emulator.forward)
    boundary.register_hook(boundary.EMULATION_NO_BATCH, emulator.no_batch)
    boundary.register_hook(boundary.GET_INTERNAL_STATE, emulator.report)
    logger.info(
        "sgl-blend emulates %s (%s) running %s at TP %d",
        config.device,
        emulator.pricer.hardware_name,
        emulator.pricer.model.name,
        config.tp,
    )
