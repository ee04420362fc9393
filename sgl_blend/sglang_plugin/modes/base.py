"""The calls every scheduling mode answers, and BlendServe's answers to them.

The plugin runtime calls its one mode at fixed points of SGLang's scheduler loop: before SGLang
builds a prefill or a decode batch and after it has, when a request arrives, after the forward,
after the batch's result, and from inside the prefill adder. A mode that has nothing to do at a
point inherits the no-op here. BlendServe without co-location is exactly that: the offline pool
(owned by the runtime, not by a mode) orders and admits offline work, and nothing else changes
SGLang's batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.kv_priority import ReuserIndex
from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.guard import guarded, live
from sgl_blend.sglang_plugin.held_decodes import HeldDecodes


def free_kv_tokens(tree_cache: Any) -> int:
    """Slots a request can get now: free ones, and cached ones the radix cache would evict."""
    return int(tree_cache.token_to_kv_pool_allocator.available_size() + tree_cache.evictable_size())


def add_within_chunk(adder: Any, chunk: int, add: Callable[[], Any]) -> Any:
    """SGLang's ``add`` with the adder's chunk room capped at ``chunk`` tokens: SGLang truncates
    the prompt to the cap and carries the rest as its chunked request. The room is then restored
    less what the request took, and "budget left?" judged again against it, since SGLang judged it
    against the cap. Without chunked prefill (no chunk room) the request is added as it is."""
    saved = adder.rem_chunk_tokens
    if saved is None:
        return add()
    adder.rem_chunk_tokens = min(saved, chunk)
    capped = adder.rem_chunk_tokens
    result = add()
    adder.rem_chunk_tokens = saved - (capped - adder.rem_chunk_tokens)
    return result if result == sgl.AddReqResult.NO_TOKEN else adder.budget_state()


HELD_FAILED = "sgl-blend could not give held decodes back to SGLang"


class Mode:
    """BlendServe (``--colocation off``): no co-location; every call leaves SGLang as it is.
    ``held``: the decodes a mode holds out of the running batch (None in a mode that holds none)."""

    def __init__(self, config: ColocationConfig) -> None:
        self.config = config
        self.held: HeldDecodes | None = None
        # The offline pool's backlog (the runtime's): offline requests that wait outside SGLang's
        # queue, parked ones among them.
        self.backlog: Mapping[str, Any] = {}

    @property
    def kv_priorities(self) -> bool:
        """Whether the offline pool should count pending reusers per prefix (Echo's eviction)."""
        return False

    def before_prefill(self, scheduler: Any, running_batch: Any) -> Any:
        """Before SGLang builds a prefill batch next to ``running_batch``; returns the running batch
        SGLang should use instead (held decodes put back into an empty one), or None."""
        return None

    def before_decode(self, scheduler: Any, batch: Any) -> None:
        """Before SGLang decodes ``batch``."""

    def end_iteration(self) -> dict[str, Any] | None:
        """SGLang has built its batch: drop the iteration's plan; returns what the iteration
        record should carry about it."""
        return None

    def prefill_built_nothing(self) -> dict[str, Any] | None:
        """SGLang built no prefill batch, so it may decode the running batch next, in the same
        iteration; a mode whose plan covers that decode too keeps it. By default, the end of the
        iteration's prefill pass is the end of its plan."""
        return self.end_iteration()

    def order_offline(self, waiting_queue: list, tree_cache: Any, reusers: ReuserIndex | None) -> None:
        """The offline pool has put the waiting queue in its order (online first); a mode that
        picks offline work itself reorders it here, before SGLang's adder walks it."""

    def may_admit(self, req: Any) -> bool | None:
        """Whether the prefill adder may admit this waiting request (None: the mode has no say)."""
        return None

    def note_arrival(self, scheduler: Any, req: Any) -> None:
        """A request entered the waiting queue for the first time."""

    def forward_done(self, record: dict[str, Any] | None, forward_s: float) -> None:
        """The forward pass is over: its iteration record (None when not recording) and its time."""

    def observe_batch(self, batch: Any) -> None:
        """SGLang has processed ``batch``'s result."""

    def holding(self) -> bool:
        """Whether decodes are held out of the running batch with their KV resident
        (`held_decodes`): SGLang must not count itself idle then."""
        return self.held is not None and self.held.any()

    @guarded("held", HELD_FAILED)
    def abort_held(self, scheduler: Any, rid: str, abort_all: bool, finished_reason: Any) -> None:
        """SGLang's ``abort_request`` has run; held decodes it cannot see are the mode's to free."""
        live(self.held).abort(scheduler, rid, abort_all, finished_reason)

    def snapshot(self) -> dict[str, Any]:
        """What ``/server_info`` shows of the mode, keyed as the plugin state's sections."""
        return {}

    def chunked_limit(self, req: Any) -> int | None:
        """The most tokens the chunked prefill under way may run now (None: SGLang's chunk)."""
        return None

    def after_chunked(self, adder: Any, req: Any, still_chunked: bool) -> None:
        """The prefill adder has given the chunked request its chunk."""

    def admit(self, adder: Any, req: Any, has_chunked_req: bool, add: Callable[[], Any]) -> Any:
        """Admit ``req`` through SGLang's adder (``add``), as the mode's plan allows."""
        return add()

    def current_config(self) -> ColocationConfig:
        """The co-location settings in force, which ``/set_internal_state`` changes."""
        return self.config

    def reconfigure(self, changes: dict[str, Any]) -> ColocationConfig:
        """Apply validated ``/set_internal_state`` changes; returns the settings now in force."""
        self.config = self.config.updated(changes)
        return self.config
