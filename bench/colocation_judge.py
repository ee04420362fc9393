"""How both co-location benches judge their runs: the configurations, the table, and the goal.

The simulator (`bench.colocation_sim`) and the CPU engine (`bench.colocation`) run the same
configurations at three online loads and hand over one ``cell`` per load: ``pattern``,
``rate_per_s``, ``target_utilisation``, ``runs`` (per configuration: the online latencies,
``offline_tokens_per_s``, ``utilisation``, ``slos_violated`` against that load's online-only run,
``pool_exhausted``, and ``failed`` when the run could not be measured) and ``search`` (per
searched configuration: the knob, the value chosen, and every trial). Everything judged here is a
ratio or a comparison inside one run of one bench.
"""

from __future__ import annotations

import argparse
from typing import Any

MODES = ("hygen", "echo", "bros")
BASELINE = "sglang-priority-searched"
SEARCHED = (*MODES, "hygen-star", BASELINE)
# Reference rows: the priority engine with its whole offline load, and with none (how far its own
# batching -- no mixed chunks -- is from the SLO before any offline work).
REFERENCES = ("sglang-priority-unbounded", "sglang-priority-online-only")
CONFIGS = ("online-only", *SEARCHED, *REFERENCES)
# The simulator searches HyGen's headroom over the online-only iteration; the CPU bench, through
# `sgl-blend tune-slo`, its absolute budget.
HEADROOM_KNOB = "headroom over online-only (s)"
KNOB_NAMES = {"hygen": "latency budget (s)", "echo": "SLO scale k", "bros": "SLO scale k",
              "hygen-star": "offline rate (req/s)", BASELINE: "offline rate (req/s)"}
GOAL_RATIO = 1.3
UTILISATION_BAND = (0.2, 0.6)
LATENCIES = ("ttft_mean", "ttft_p99", "tbt_mean", "tbt_p99")
# Echo's and BROS's deadlines are k times online-only's P99 TTFT and TBT. Below k = 1 they ask each
# online request for less than online-only achieves: at k = 0.5 Echo's TTFT deadline fell below
# online-only's mean TTFT, its deadline budget clamped to 0 and it ran no offline work.
MIN_DEADLINE_SCALE = 1.0


def deadline_scale(text: str) -> float:
    """An SLO scale k from the command line, refused below `MIN_DEADLINE_SCALE`."""
    value = float(text)
    if value < MIN_DEADLINE_SCALE:
        raise argparse.ArgumentTypeError(f"{value:g} is below {MIN_DEADLINE_SCALE:g}: the deadlines would ask for "
                                         "less than online-only achieves")
    return value


def add_deadline_scale_arguments(parser: argparse.ArgumentParser, high: float = 8.0) -> None:
    """The range the simulator's and the emulated engine's benches search Echo's and BROS's SLO
    scale k in."""
    parser.add_argument("--low-echo-scale", type=deadline_scale, default=MIN_DEADLINE_SCALE,
                        help="Echo's SLO scale k, lowest (at least 1)")
    parser.add_argument("--low-bros-scale", type=deadline_scale, default=MIN_DEADLINE_SCALE,
                        help="BROS's SLO scale k, lowest (at least 1; below it the TPOT deadline is also shorter "
                             "than a decode iteration, every RT request is infeasible and BROS's guard lifts the "
                             "budget)")
    parser.add_argument("--high-scale", type=deadline_scale, default=high, help="Echo's and BROS's SLO scale k, highest")


def ratio(numerator: float, denominator: float) -> float | None:
    """None when the denominator is 0 (the baseline ran no offline work)."""
    return round(numerator / denominator, 2) if denominator > 0 else None


def baseline_score(cell: dict[str, Any]) -> float:
    """The searched baseline's offline throughput as the modes are measured against it: 0 where it
    missed the SLO or failed. Its search may find no rate that meets the SLO on the tuning trace,
    and a baseline scored for throughput it bought with the SLO makes every mode look worse than
    it is (a mode that met the SLO would be compared with one that did not)."""
    run = cell["runs"][BASELINE]
    return 0.0 if run["slos_violated"] or "failed" in run else run["offline_tokens_per_s"]


def key(cell: dict[str, Any]) -> str:
    return f"{cell['pattern']}@{cell['rate_per_s']:.3g}"


def table(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (load, configuration); latencies in ms; the co-location modes and HyGen* with
    their offline throughput over the searched priority baseline's."""
    rows = []
    for cell in cells:
        baseline = baseline_score(cell)
        for config in CONFIGS:
            run = cell["runs"][config]
            rows.append({
                "pattern": cell["pattern"], "rate_per_s": round(cell["rate_per_s"], 3), "config": config,
                "utilisation": round(run["utilisation"], 3),
                **{metric: round(run[metric] * 1000, 2) for metric in LATENCIES},
                "offline_tok_s": round(run["offline_tokens_per_s"], 1),
                "slos_met": not run["slos_violated"],
                "over_baseline": ratio(run["offline_tokens_per_s"], baseline)
                if config in (*MODES, "hygen-star") else None,
            })
    return rows


def targets(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The goal -- each co-location mode >= 1.3x the searched priority baseline's offline
    throughput at the lowest load, SLOs met at every load -- and the load band, each with the
    figures it rests on. A baseline that ran no offline work, or missed the SLO (`baseline_score`),
    is beaten by any mode that did run offline work."""
    lowest: dict[str, dict[str, Any]] = {}
    for cell in cells:
        if cell["pattern"] not in lowest or cell["rate_per_s"] < lowest[cell["pattern"]]["rate_per_s"]:
            lowest[cell["pattern"]] = cell
    ratios = {mode: {key(c): ratio(c["runs"][mode]["offline_tokens_per_s"], baseline_score(c))
                     for c in lowest.values()} for mode in MODES}

    def beats(mode: str, cell: dict[str, Any]) -> bool:
        ours = cell["runs"][mode]["offline_tokens_per_s"]
        return ours >= GOAL_RATIO * baseline_score(cell) and ours > 0

    at_lowest = {mode: all(beats(mode, c) for c in lowest.values()) for mode in MODES}
    slos = {config: {key(c): not c["runs"][config]["slos_violated"] for c in cells} for config in SEARCHED}
    utilisation = {key(c): round(c["runs"]["online-only"]["utilisation"], 3) for c in cells}
    return {
        "goal": f"each co-location mode >= {GOAL_RATIO}x {BASELINE} offline tok/s at the lowest load, "
                "SLOs met at every load",
        "over_baseline_at_lowest_load": ratios,
        f"at_least_{GOAL_RATIO}x": at_lowest,
        "slos_met": slos,
        "slos_met_everywhere": {config: all(by.values()) for config, by in slos.items()},
        "goal_met": {mode: at_lowest[mode] and all(slos[mode].values()) for mode in MODES},
        "online_only_utilisation": utilisation,
        "loads_within_20_60": all(UTILISATION_BAND[0] <= u <= UTILISATION_BAND[1] for u in utilisation.values()),
        "pool_exhausted": sorted(f"{key(c)}/{config}" for c in cells for config, run in c["runs"].items()
                                 if run.get("pool_exhausted")),
        "failed_runs": sorted(f"{key(c)}/{config}: {run['failed']}" for c in cells
                              for config, run in c["runs"].items() if "failed" in run),
        "failed_search_trials": sorted(f"{key(c)}/{config}@{trial['value']:.4g}: {trial['failed']}" for c in cells
                                       for config, search in c["search"].items() for trial in search["trials"]
                                       if "failed" in trial),
    }


def knob_text(search: dict[str, Any]) -> str:
    value = search["value"]
    text = f"{value * 1000:.2f} ms" if search["knob"].endswith("(s)") else f"{value:.3g}"
    return text + ("" if search["met"] else " (not met on tuning)")


def markdown_table(rows: list[dict[str, Any]], throughput: str) -> list[str]:
    lines = [f"| arrivals | online req/s | config | engine util. | TTFT mean / P99 (ms) | TBT mean / P99 (ms) | "
             f"{throughput} | SLOs met | / priority-searched |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        over = "" if row["over_baseline"] is None else f"{row['over_baseline']}x"
        lines.append(f"| {row['pattern']} | {row['rate_per_s']:g} | {row['config']} | {row['utilisation']:.0%} | "
                     f"{row['ttft_mean']} / {row['ttft_p99']} | {row['tbt_mean']} / {row['tbt_p99']} | "
                     f"{row['offline_tok_s']:g} | {'yes' if row['slos_met'] else 'no'} | {over} |")
    return lines


def markdown_knobs(cells: list[dict[str, Any]]) -> list[str]:
    lines = []
    for cell in cells:
        knobs = "; ".join(f"{config} {KNOB_NAMES[config]} {knob_text(cell['search'][config])}" for config in SEARCHED)
        lines.append(f"- {key(cell)} (target utilisation {cell['target_utilisation']:.0%}): {knobs}.")
    return lines


def markdown_results(report: dict[str, Any], throughput: str, slos: str) -> list[str]:
    """The table, the SLO it is judged at, and the knobs each search found: how both co-location
    reports (simulator and CPU engine) open."""
    return [*markdown_table(report["table"], throughput), "",
            f"SLOs: {slos} within {report['tolerance']:.0%} of online-only on the same evaluation trace. "
            "Knobs searched on a separate tuning trace:", "", *markdown_knobs(report["cells"])]


def markdown_goal(goal: dict[str, Any]) -> list[str]:
    lines = [f"| mode | / priority-searched at the lowest load | >= {GOAL_RATIO}x | SLOs met at every load | goal met |",
             "|---|---|---|---|---|"]
    for mode in MODES:
        ratios = ", ".join(f"{where} {'n/a' if r is None else f'{r}x'}"
                           for where, r in goal["over_baseline_at_lowest_load"][mode].items())
        lines.append(f"| {mode} | {ratios} | {'yes' if goal[f'at_least_{GOAL_RATIO}x'][mode] else 'no'} | "
                     f"{'yes' if goal['slos_met_everywhere'][mode] else 'no'} | "
                     f"{'yes' if goal['goal_met'][mode] else 'no'} |")
    lines.append("")
    lines.append(f"Online-only utilisation within 20-60% at every load: {'yes' if goal['loads_within_20_60'] else 'no'}"
                 f"; offline pool ran dry: {', '.join(goal['pool_exhausted']) or 'nowhere'}.")
    for kind in ("failed_runs", "failed_search_trials"):
        if goal[kind]:
            lines.append(f"{kind.replace('_', ' ').capitalize()} (count as missing every SLO): "
                         + "; ".join(goal[kind]) + ".")
    return lines
