"""HyGen's SLO-aware profiler against a live server: replay, measure, move the budget, repeat.

One server serves every trial: the budget moves through ``POST /set_internal_state`` between
replays, so the search costs replays, not restarts. The server must run in ``hygen`` mode with the
latency model the result will name (mode and model are launch settings). Each trial replays the same online trace while
an offline load keeps the engine busy, then checks every SLO (`core.slo_search`). An SLO given as
``baseline`` is first measured on the online trace alone: "within tolerance of online-only".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from sgl_blend.batch_lines.lines import BatchLine
from sgl_blend.client import http
from sgl_blend.core.request_timing import summarize
from sgl_blend.core.slo_search import SLO, SearchResult, search_budget
from sgl_blend.measure.online_replay import OfflineLoad, OnlineRequest, replay_with_offline

BASELINE = "baseline"


def set_colocation(base_url: str, changes: dict[str, float | None], api_key: str | None = None) -> None:
    """Apply numeric co-location settings on a running server (None clears the latency budget);
    raise if the scheduler rejects them."""
    settings = {
        (f"sgl_blend_{key}" if value is not None else "sgl_blend_clear_latency_budget"): (
            value if value is not None else 1
        )
        for key, value in changes.items()
    }
    with http.client(base_url, api_key) as client:
        response = client.post("/set_internal_state", json={"server_args": settings})
    response.raise_for_status()
    answer = response.json()
    results = answer if isinstance(answer, list) else [answer]
    if not results or not all(result is True for result in results):
        raise RuntimeError(f"the server rejected co-location settings {changes} (see its log): {answer}")


def measure(
    base_url: str, trace: Sequence[OnlineRequest], offline_lines: Sequence[BatchLine] | None, concurrency: int
) -> dict[str, float]:
    async def run() -> dict[str, float]:
        offline = OfflineLoad(base_url, offline_lines, concurrency=concurrency) if offline_lines else None
        timings, throughput = await replay_with_offline(base_url, trace, offline)
        return {**summarize(timings), **throughput}

    return asyncio.run(run())


def resolve_slos(requested: dict[str, str], baseline: Callable[[], dict[str, float]]) -> tuple[list[SLO], dict | None]:
    """SLO targets from the flags: seconds, or ``baseline`` (measured once, online only)."""
    measured = baseline() if any(value == BASELINE for value in requested.values()) else None
    slos = []
    for metric, value in requested.items():
        if value == BASELINE:
            assert measured is not None, "measured above, since a target asks for it"
            slos.append(SLO(metric, measured[metric]))
            continue
        try:
            slos.append(SLO(metric, float(value)))
        except ValueError:
            raise ValueError(f"--{metric.replace('_', '-')} takes seconds or '{BASELINE}', got {value!r}") from None
    return slos, measured


def tune_budget(
    base_url: str,
    trace: Sequence[OnlineRequest],
    offline_lines: Sequence[BatchLine],
    requested: dict[str, str],
    latency_model: dict[str, Any],
    *,
    tolerance: float,
    low_s: float,
    high_s: float,
    steps: int,
    concurrency: int = 64,
    api_key: str | None = None,
) -> dict[str, Any]:
    """The search, end to end; returns what `tune-slo` stores (``latency_budget_s`` None if even
    ``low_s`` misses an SLO)."""
    slos, measured = resolve_slos(requested, lambda: measure(base_url, trace, None, concurrency))

    def evaluate(budget_s: float) -> dict[str, float]:
        set_colocation(base_url, {"latency_budget_s": budget_s}, api_key)
        return measure(base_url, trace, offline_lines, concurrency)

    result: SearchResult = search_budget(evaluate, slos, tolerance, low_s, high_s, steps)
    return {
        "mode": "hygen",
        "latency_budget_s": result.budget_s,
        "latency_model": latency_model,
        "tolerance": tolerance,
        "slos": [{**asdict(slo), "limit_s": slo.limit(tolerance)} for slo in slos],
        "binding": result.binding,
        "online_only": measured,
        "steps": [asdict(step) for step in result.steps],
    }
