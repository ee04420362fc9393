"""How many lines a batch runner keeps in flight on one engine slot (a DP rank of a worker).

The window must keep the engine full: as requests finish, the scheduler must already hold the next
ones, from both ends of the plan. It need not be larger: every line in it is a request the engine
holds and the host tracks, and on the in-process path nothing is gained by more. It is a multiple
of the requests the engine runs at once -- its KV pool over the lines' mean footprint, capped by
its running limit -- measured on the emulated H100 in real time (`bench.window_size`, docs/results.md).
The simulator's feed (`sim.feed`) sizes its window with these same functions.

An engine in a co-location mode (HyGen, Echo, BROS) admits offline lines only into what its
online work leaves, often a few dozen of the hundreds it could hold. The rest of a full window
waits in SGLang's queue, and every scheduler iteration walks that queue (the offline pool's
reconciling and proposal, the mode's plan, SGLang's own load report): on the emulated H100 about
970 waiting lines took the scheduler's whole core and made the device wait on the host for 45% of
the time. Such an engine's window follows what it runs: `colocated_window`, from its queue
and running batch as it reports them (`RankLoad`), looked at every `QUEUE_LOOK_S`.
"""

from __future__ import annotations

from dataclasses import dataclass

# Lines in flight per request the engine runs at once. On trace2 (4,000 lines, emulated H100 in
# real time) job times at x1, x2, x4 and x8 were within 2% for BlendServe and for lpm
# (`bench.window_size`); with free forwards the Batch API fed 805 lines/s at x2 and 682 at x1
# (`bench.feed_rate`, 4,000 lines): 2 is the smallest that kept the engine full in both.
WINDOW_MULTIPLE = 2
# A window for a server that does not say what it holds.
FALLBACK_WINDOW = 256
# The fewest lines a co-locating engine has waiting: HyGen at 30% of online capacity on the
# emulated H100 moved 7x the offline tokens with 32 lines in flight as with the full window
# (`bench.colocation_emulated --mode-max-inflight 32`, docs/colocation.md).
QUEUE_FLOOR = 32
# How often the runner reads a co-locating engine's queue length (SGLang's load report).
QUEUE_LOOK_S = 0.5


def line_footprint(prompt_tokens: int, output_bound: int) -> float:
    """The KV tokens a line holds over its life, on average: its prompt and half its output."""
    return prompt_tokens + output_bound / 2.0


def concurrent_requests(kv_tokens: int | None, max_running: int | None, footprint: float | None) -> int | None:
    """Requests of ``footprint`` KV tokens each that an engine runs at once (None: it does not say)."""
    fits = int(kv_tokens / footprint) if kv_tokens and footprint else None
    bounds = [bound for bound in (fits, max_running) if bound]
    return max(1, min(bounds)) if bounds else None


def lines_in_flight(concurrent: int | None, chosen: int | None = None) -> int:
    """Lines in flight on one slot: the window a user ``chosen`` (``--max-inflight``), else
    `WINDOW_MULTIPLE` times what the slot runs at once."""
    if chosen:
        return chosen
    return WINDOW_MULTIPLE * concurrent if concurrent else FALLBACK_WINDOW


@dataclass(frozen=True, slots=True)
class RankLoad:
    """One DP rank's scheduler as SGLang's load report gives it: requests in its waiting queue
    and in its running batch (online ones too; a parked or held request is in neither)."""

    waiting: int
    running: int


def colocated_window(full: int, inflight: int, load: RankLoad) -> int:
    """Lines in flight on a co-locating engine's slot: those it runs now, and as many again
    waiting, at least `QUEUE_FLOOR`; never more than the ``full`` window. Doubling lets the window
    grow as fast as the engine's share does. Of the ``inflight`` lines not in the queue, only as
    many as the engine says it runs count as running: the rest are parked, or still on their way
    (tokenized, not yet received). Counting lines on their way as running let a tokenizer that
    lagged its scheduler for more than one look double the window at every look (2-core CI host:
    128 lines queued where 33 were due)."""
    running = min(max(0, inflight - load.waiting), load.running)
    return min(full, running + max(QUEUE_FLOOR, running))
