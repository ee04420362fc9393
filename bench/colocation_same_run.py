"""The co-location simulator on the emulated run it is given: each `bench.front_end` replay
simulated with that replay's own host gaps and front end.

`bench.colocation_sim_check` predicts the judge's evaluation seeds from what was measured on
another run, so where it misses, the simulated engine and this host's run-to-run drift are mixed
up (on this 2-core host one configuration at one knob can move a third more or less offline work
from one run to the next). Here nothing differs between the two sides but the engine: the trace
(the tuning seed's, as replayed), the offline batch, the host gaps after each batch and the two
crossings outside the scheduler are the replay's own. What differs beyond 10% is the simulated
engine's, or what it does not model.

Per replay, emulated against simulated:
- the client's P99 TTFT (simulated: the engine's time from receipt, plus one measured request's
  two crossings, `sim.front_end`) and P99 TBT;
- the scheduler's P99 TTFT: from the scheduler's receipt of an online request to the end of the
  batch that completed its prompt (the iteration log's ``online_prefilled``), against the
  simulated engine's time from receipt to first token;
- the engine's P99 TBT: per online token decoded, its batch's launch-to-launch period (what the
  client's TBT is before the way back), against the simulated TBT, which is the engine's;
- offline tok/s decoded by the engine in the replay's window.

    python -m bench.colocation_same_run   # ~2 min, after bench.front_end
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.colocation_emulated import TUNE_SEED, work_folder
from bench.colocation_sim_check import (
    FLAG,
    RESULTS,
    Simulator,
    differences,
    engine_figures,
    host_gaps,
    iteration_log,
    online_arrivals,
    over_flag,
)
from sgl_blend.sim.front_end import FrontEnd

COMPARED = ("ttft_p99", "scheduler_ttft_p99", "tbt_p99", "engine_tbt_p99", "engine_offline_tokens_per_s")


def emulated(row: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, float]:
    """A probe replay's figures: the client's from the probe, the engine's from its records inside
    the replay's window."""
    return {
        "ttft_p99": row["ttft_p99"],
        "tbt_p99": row["tbt_p99"],
        **engine_figures(records, row, row["requests"]),
    }


def check(report: dict[str, Any], probe: dict[str, Any], work: Path) -> dict[str, Any]:
    simulator = Simulator.for_report(report)
    cells = {cell["share"]: cell for cell in report["cells"]}
    rows = []
    for row in probe["rows"]:
        cell = cells[row["share"]]
        arrivals = online_arrivals(report, cell["rate_per_s"], TUNE_SEED, simulator.tokenizer, probe["requests"])
        if len(arrivals) != row["requests"]:
            raise ValueError(f"{row['config']}: {len(arrivals)} requests in the trace, {row['requests']} replayed")
        records = iteration_log(work / row["records"])
        front = FrontEnd(tuple((to, back) for to, back in row["delays_s"]))
        host = host_gaps(row["config"], records, [row])
        simulated = simulator.run(row["config"], row["value"], cell["targets_s"], arrivals, host, front)
        measured = emulated(row, records)
        diff = differences(measured, simulated, COMPARED)
        result = {
            "share": row["share"],
            "config": row["config"],
            "value": row["value"],
            "emulated": measured,
            "simulated": {metric: simulated[metric] for metric in COMPARED},
            "difference": diff,
            "over_10_percent": over_flag(diff),
        }
        print(json.dumps(result), flush=True)
        rows.append(result)
    return {"probe": probe.get("source"), "seed": TUNE_SEED, "requests": probe["requests"], "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "Each figure: emulated / simulated with the replay's own host gaps and front end (difference).",
        "",
        "| load | config | client P99 TTFT ms | scheduler's P99 TTFT ms | client P99 TBT ms | engine's P99 TBT ms "
        "| offline tok/s decoded |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:

        def shown(metric: str, scale: float, digits: int, row: dict[str, Any] = row) -> str:
            diff = row["difference"][metric]
            mark = "-" if diff is None else f"{diff:+.0%}" + (" **" if abs(diff) > FLAG else "")
            return (
                f"{row['emulated'][metric] * scale:.{digits}f} / {row['simulated'][metric] * scale:.{digits}f} ({mark})"
            )

        lines.append(
            f"| {row['share']:.0%} | {row['config']} | {shown('ttft_p99', 1000, 0)} | "
            f"{shown('scheduler_ttft_p99', 1000, 1)} | {shown('tbt_p99', 1000, 1)} | "
            f"{shown('engine_tbt_p99', 1000, 1)} | "
            f"{shown('engine_offline_tokens_per_s', 1, 0)} |"
        )
    lines += ["", "** over 10%."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=RESULTS / "colocation_emulated.json")
    parser.add_argument("--front-end", type=Path, default=RESULTS / "front_end.json", help="`bench.front_end`'s output")
    parser.add_argument("--out", type=Path, default=RESULTS / "colocation_same_run.json")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    probe = {**json.loads(args.front_end.read_text()), "source": str(args.front_end)}
    result = check(report, probe, work_folder(args.front_end))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
