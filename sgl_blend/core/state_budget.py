"""How long an iteration may run, from what the online requests are doing right now.

One iteration's length is felt by online requests in two ways: each online request decoding in
it waits that long for its next token (its TBT), and an online request that arrives while it runs
waits for it to end before its prefill can start (its TTFT). So the budget depends on the state:

- **online requests decode or wait** (HyGen): the predicted online-only iteration plus a headroom
  ``h`` -- what an arrival may wait beyond what it would wait online-only, which is what the TTFT
  tolerance pays for and the SLO search finds -- but never beyond the TBT target while online
  requests decode, nor beyond the TTFT slack ``TTFT target - waited`` of an online request waiting
  for its prefill;
- **online requests present** (Echo): the tightest per-request slack ``TTFT + i·TPOT - waited``
  (`deadline_budget`), capped by the TBT target;
- **no online request at all**: the TTFT slack -- how much longer than online-only an arrival may
  wait for the iteration under way (``idle_budget_s``; HyGen falls back on its headroom, the same
  allowance), for both.

The online work itself always runs: a budget is never below the online part's prediction, plus
`NEAR_ZERO_FRACTION` of it, so offline work whose marginal time is that small -- an offline decode
beside a few weight-bound online decodes -- is still admitted when the slack is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# An iteration may grow by this share of its online part even at zero slack: a fitted predictor
# is not this accurate on a few weight-bound decodes, so work this cheap cannot be told from none,
# and it moves a P99 TBT by at most this share.
NEAR_ZERO_FRACTION = 0.01


class OnlineTimed(Protocol):
    @property
    def arrival(self) -> float: ...


class OnlineRunning(OnlineTimed, Protocol):
    @property
    def online(self) -> bool: ...

    @property
    def output_tokens(self) -> int: ...


def deadline_budget(
    now: float,
    running: Sequence[OnlineRunning],
    waiting: Sequence[OnlineTimed],
    ttft_s: float,
    tpot_s: float,
    idle_budget_s: float | None,
) -> float | None:
    """Echo's per-iteration SLO: the tightest ``TTFT + i·TPOT - waited`` over online requests,
    where ``i`` is the index of the token each will produce next (slack carries forward)."""
    slacks = [ttft_s - (now - request.arrival) for request in waiting]
    slacks += [
        ttft_s + request.output_tokens * tpot_s - (now - request.arrival) for request in running if request.online
    ]
    if not slacks:
        return idle_budget_s
    return max(min(slacks), 0.0)


def hygen_budget(
    now: float,
    online_s: float,
    decoding: bool,
    waiting: Sequence[OnlineTimed],
    headroom_s: float,
    tbt_target_s: float | None,
    ttft_target_s: float | None,
    idle_budget_s: float | None,
) -> float | None:
    """HyGen's budget by state (module docstring); ``online_s`` is the predicted online part."""
    if not decoding and not waiting:
        return idle_budget_s if idle_budget_s is not None else headroom_s
    budget = online_s + headroom_s
    if decoding and tbt_target_s is not None:
        budget = min(budget, tbt_target_s)
    if waiting and ttft_target_s is not None:
        budget = min(budget, min(ttft_target_s - (now - request.arrival) for request in waiting))
    return floored(budget, online_s)


def echo_budget(slack_s: float, online_s: float, tbt_target_s: float) -> float:
    """Echo's deadline slack while online requests are present, capped by the TBT target (every
    online decode waits the whole iteration for its next token)."""
    return floored(min(slack_s, tbt_target_s), online_s)


def floored(budget: float, online_s: float) -> float:
    """``budget``, but never below the online part plus `NEAR_ZERO_FRACTION` of it."""
    return max(budget, online_s * (1.0 + NEAR_ZERO_FRACTION))
