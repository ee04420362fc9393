"""The prefill adder SGLang builds each prefill batch with, made the plugin's.

SGLang picks its adder class through ``Scheduler.get_prefill_adder_class``; the plugin's subclass
keeps every token budget, chunking, locking and retraction rule of SGLang's and only says no
more often: to offline work the policy did not propose (the waiting queue is ordered so that
every request behind it is unproposed offline work too), and, in a co-location mode, to whatever
the iteration's plan leaves out. Its prefill room is the policy's, cut from the chunk and mixed
decode tokens SGLang constructs it with, read by parameter name. The class is built on first use,
since its base class is SGLang's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sgl_blend.sglang_plugin import sglang_boundary as sgl
from sgl_blend.sglang_plugin.runtime import PluginRuntime


def prefill_adder_class(runtime: PluginRuntime) -> type:
    chunk = sgl.argument(sgl.ADDER_INIT, "rem_chunk_tokens")
    mixed_decodes = sgl.argument(sgl.ADDER_INIT, "num_mixed_decode_tokens")

    class BlendPrefillAdder(sgl.PrefillAdder):
        """SGLang's adder, admitting offline work only in the order the policy proposed and, when
        co-locating, only within the iteration's plan; its prefill room is the policy's."""

        chunked_req_limit: int | None  # SGLang's, set in its __init__

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            given = (self, *args)
            runtime.cap_prefill(self, chunk.read(given, kwargs), mixed_decodes.read(given, kwargs))

        def add_chunked_req(self, req: Any) -> Any:
            limit = runtime.mode.chunked_limit(req)
            if limit is not None:
                self.chunked_req_limit = limit if self.chunked_req_limit is None else min(self.chunked_req_limit, limit)
            result = super().add_chunked_req(req)
            runtime.prefill_continues(req)
            runtime.mode.after_chunked(self, req, result is not None)
            return result

        def add_one_req(self, req: Any, has_chunked_req: bool, truncation_align_size: Any) -> Any:
            if runtime.may_admit(req) is False:
                return sgl.AddReqResult.OTHER

            def add() -> Any:
                return super(BlendPrefillAdder, self).add_one_req(req, has_chunked_req, truncation_align_size)

            result = runtime.mode.admit(self, req, has_chunked_req, add)
            if self.can_run_list and self.can_run_list[-1] is req:
                runtime.admitted(req, self.tree_cache)
            return result

    return BlendPrefillAdder


def prefill_adder_hook(runtime: PluginRuntime) -> Callable[[Any], type]:
    """The REPLACE hook for ``Scheduler.get_prefill_adder_class``: one class per process, built
    the first time SGLang asks."""
    build = functools.cache(functools.partial(prefill_adder_class, runtime))
    return lambda _scheduler: build()
