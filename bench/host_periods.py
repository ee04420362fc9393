"""What an online decode iteration costs in each configuration of a co-location judge's report.

The judge's online-only run and a co-location mode's run replay the same online trace on the same
emulated engine. A batch that decodes online requests and nothing else -- no prefill, no offline
decode -- prices the same forward for the same number of requests in both, so a longer period
(launch to launch) beside an offline batch is the host's: the scheduler's plan and bookkeeping for
the offline requests it holds, and the processes it shares this host's two cores with (the batch
runner writing results, the detokenizer, the client). Its records give, per configuration and
decode batch size, the median and P90 period and the median time the host waited on the device.

    python -m bench.host_periods --report bench/results/colocation_emulated_hygen_host.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.colocation_emulated import in_replay, record_file, work_folder
from sgl_blend.measure.latency_profile import read_records

# Online decodes per batch, grouped: a bucket holds batches of at least its bound and fewer than the next.
BUCKETS = (1, 4, 8, 16, 24)


def online_decode_only(record: dict[str, Any]) -> bool:
    """A batch of online decodes alone, after no idle spell (it has a period)."""
    return (
        "period_s" in record
        and record["online_decode"] > 0
        and record["prefill_reqs"] == 0
        and record["offline_decode"] == 0
    )


def bucket_of(decodes: int) -> int:
    return max(bound for bound in BUCKETS if bound <= decodes)


def periods(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per bucket of online decodes: batches, median and P90 period, median host wait on the device."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        if online_decode_only(record):
            grouped.setdefault(bucket_of(record["online_decode"]), []).append(record)
    rows = []
    for bound in sorted(grouped):
        batch = grouped[bound]
        spans = sorted(record["period_s"] for record in batch)
        rows.append(
            {
                "decodes_from": bound,
                "batches": len(batch),
                "period_median_s": statistics.median(spans),
                "period_p90_s": spans[min(len(spans) - 1, int(0.9 * len(spans)))],
                "waited_median_s": statistics.median(record["forward_s"] for record in batch),
            }
        )
    return rows


def measure(report: dict[str, Any], work: Path) -> dict[str, Any]:
    """Every evaluation run of every configuration in ``report``, its records read from ``work``."""
    cells = []
    for cell in report["cells"]:
        configs = {}
        for config, runs in cell["runs"].items():
            value = cell["search"].get(config, {}).get("value")
            path = work / record_file(config, cell["share"], value)
            if not path.exists():
                raise SystemExit(f"{path}: no iteration records for {config} at {cell['share']:.0%}")
            records = [record for record in read_records(path) if any(in_replay(record, run) for run in runs)]
            configs[config] = {"value": value, "runs": len(runs), "rows": periods(records)}
        cells.append({"share": cell["share"], "configs": configs})
    return {"report": report.get("source"), "buckets": list(BUCKETS), "cells": cells}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "Batches of online decodes alone: median / P90 launch-to-launch period (ms), median host wait "
        "on the device (ms), batches.",
        "",
        "| load | config | online decodes | period median | period P90 | host waited | batches |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in result["cells"]:
        for config, found in cell["configs"].items():
            for row in found["rows"]:
                lines.append(
                    f"| {cell['share']:.0%} | {config} | {row['decodes_from']}+ | "
                    f"{row['period_median_s'] * 1000:.1f} | {row['period_p90_s'] * 1000:.1f} | "
                    f"{row['waited_median_s'] * 1000:.2f} | {row['batches']} |"
                )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = result["cells"]
    fig, axes = plt.subplots(1, len(cells), figsize=(6 * len(cells), 4), squeeze=False)
    for axis, cell in zip(axes[0], cells):
        for config, found in cell["configs"].items():
            rows = found["rows"]
            axis.plot(
                [row["decodes_from"] for row in rows],
                [row["period_median_s"] * 1000 for row in rows],
                marker="o",
                label=config,
            )
        axis.set_title(f"{cell['share']:.0%} of online capacity")
        axis.set_xlabel("online decodes in the batch (bucket from)")
        axis.set_ylabel("median period, ms")
        axis.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, required=True, help="a `bench.colocation_emulated` report")
    parser.add_argument("--out", type=Path, help="default: beside the report, suffixed _periods")
    args = parser.parse_args(argv)
    report = {**json.loads(args.report.read_text()), "source": str(args.report)}
    out = args.out or args.report.with_name(f"{args.report.stem}_periods.json")
    result = measure(report, work_folder(args.report))
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result) + "\n")
    plot(result, out.with_suffix(".png"))
    print(markdown(result))


if __name__ == "__main__":
    main()
