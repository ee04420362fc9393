"""The requests SGLang's load report says it runs, counted through its mixed iterations.

SGLang counts them as its running batch's (``SchedulerLoadInquirer.get_loads``). A mixed iteration
-- a prefill with the running decodes folded into it, as every sgl-blend engine runs them
(``--enable-mixed-chunk``) -- moves those decodes into the batch it launches and leaves an empty
running batch in their place until the result comes back, and SGLang publishes every extend
batch's report from just there. A co-locating engine admits a little offline work nearly every
iteration, so nearly every report said 0: Echo on the emulated H100 at 30% load reported 0
running in 137 of 144 looks while it decoded about 30 offline lines. The batch runner sizes a
co-locating engine's window from that figure (`sgl_blend.server.window.colocated_window`), so
Echo's window sat at its floor and its selector had no waiting line to choose from in most
iterations. Here the report counts the running batch's requests and the unfinished ones of the
batch last launched, each once (a decode batch is the running batch itself).
"""

from __future__ import annotations

from typing import Any


class LaunchedRequests:
    """The requests of the batch the scheduler launched last."""

    def __init__(self) -> None:
        self._reqs: list[Any] = []

    def launched(self, batch: Any) -> None:
        # A decode batch's requests are the running batch's: nothing to add, every iteration.
        self._reqs = [] if batch.forward_mode.is_decode() else batch.reqs

    def running(self, running_batch: Any) -> int:
        """Requests the engine runs now: its running batch's, and the launched batch's that have
        not finished (a mixed batch's decodes and prefills)."""
        if not self._reqs:
            return len(running_batch.reqs)
        ids = {id(req) for req in running_batch.reqs}
        ids.update(id(req) for req in self._reqs if not req.finished())
        return len(ids)
