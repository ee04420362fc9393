"""The runner's window: the fewest lines in flight that keep an emulated H100 full.

Each run is `sgl-blend run-batch --emulate h100 --model llama-3.1-8b` in real time (factor 1) on a
Table 2 trace, with the window capped (``--max-inflight``) at a multiple of the requests the
engine runs at once -- its KV pool over the lines' mean footprint, capped by its running limit,
as the runner computes it (`server.window`). Reported per multiple and policy: the emulated job
time with the host's lateness charged, the idle share and the cached prompt tokens. The smallest
multiple within `TOLERANCE` of every policy's best time is the runner's `WINDOW_MULTIPLE`.

Writes ``bench/results/window_size.{json,md}``.

    python -m bench.window_size --lines 4000 --workloads trace2 --policies blendserve,lpm
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from bench.shipped_path import DEVICE, MODEL, RESULTS, run, write_workload
from sgl_blend.emulation.launch import emulated_launch
from sgl_blend.server.window import WINDOW_MULTIPLE, concurrent_requests, line_footprint
from sgl_blend.sim.batch_file import load_batch_file

MULTIPLES = (1.0, 1.5, 2.0, 4.0, 8.0)
# A multiple keeps the engine full when every policy's job takes at most this much longer than
# at its best multiple (the seed-to-seed spread of one run here is about 1%).
TOLERANCE = 0.02


def concurrent_for(batch_file: Path) -> int:
    """The requests the emulated engine runs at once for this file's lines, as the runner sizes it."""
    sizing = emulated_launch(DEVICE, MODEL).sizing
    requests = load_batch_file(batch_file, MODEL).requests
    footprint = sum(line_footprint(request.prompt_len, request.max_new_tokens) for request in requests) / len(requests)
    return concurrent_requests(sizing.max_total_tokens, sizing.max_running_requests, footprint) or 1


def smallest_full(rows: dict[str, dict[str, Any]]) -> float | None:
    """The smallest multiple whose every policy is within `TOLERANCE` of that policy's best."""
    best = {}
    for by_policy in rows.values():
        for policy, result in by_policy.items():
            best[policy] = min(best.get(policy, math.inf), result["seconds_with_lateness"])
    for multiple in sorted(rows, key=float):
        if all(result["seconds_with_lateness"] <= (1 + TOLERANCE) * best[policy]
               for policy, result in rows[multiple].items()):
            return float(multiple)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--workloads", default="trace2")
    parser.add_argument("--policies", default="blendserve,lpm")
    parser.add_argument("--multiples", default=",".join(str(multiple) for multiple in MULTIPLES))
    parser.add_argument("--lock", type=Path, default=None, help="flock this file around each run (shared machine)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sgl-blend-window-size"))
    parser.add_argument("--out", type=Path, default=RESULTS / "window_size.json")
    args = parser.parse_args(argv)
    report: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    for workload in args.workloads.split(","):
        batch_file = args.work / f"{workload}-{args.lines}.jsonl"
        batch_file.parent.mkdir(parents=True, exist_ok=True)
        entry = report.setdefault(workload, {"rows": {}})
        if not batch_file.exists() or "concurrent" not in entry:
            entry.update(write_workload(workload, args.lines, batch_file), concurrent=concurrent_for(batch_file))
        for multiple in args.multiples.split(","):
            cap = max(1, round(float(multiple) * entry["concurrent"]))
            for policy in args.policies.split(","):
                if policy in entry["rows"].get(multiple, {}):
                    continue
                summary = run(policy, batch_file, args.work / "runs" / f"{workload}-{policy}-x{multiple}", False,
                              args.lock, 1.0, ("--max-inflight", str(cap)))
                entry["rows"].setdefault(multiple, {})[policy] = {
                    key: summary[key] for key in ("seconds", "seconds_with_lateness", "late_seconds", "idle_seconds",
                                                  "cached_tokens", "tokens_per_s")} | {"window": cap}
                args.out.write_text(json.dumps(report, indent=2) + "\n")
                print(f"{workload} x{multiple} {policy}: {summary['seconds_with_lateness']} s", flush=True)
        entry["smallest_full_multiple"] = smallest_full(entry["rows"])
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"Job time with lateness (emulated s) by window multiple; the runner uses x{WINDOW_MULTIPLE}.", ""]
    for workload, entry in report.items():
        policies = sorted({policy for row in entry["rows"].values() for policy in row})
        lines += [f"**{workload}** ({entry['lines']} lines, {entry['concurrent']} requests at once; smallest "
                  f"multiple within {TOLERANCE:.0%} of each policy's best: x{entry['smallest_full_multiple']})", "",
                  "| multiple | window | " + " | ".join(policies) + " |", "|---|---|" + "---|" * len(policies)]
        for multiple in sorted(entry["rows"], key=float):
            row = entry["rows"][multiple]
            window = next(iter(row.values()))["window"]
            lines.append(f"| x{multiple} | {window} | " + " | ".join(
                f"{row[policy]['seconds_with_lateness']:.1f}" if policy in row else "-" for policy in policies) + " |")
        lines.append("")
    args.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
