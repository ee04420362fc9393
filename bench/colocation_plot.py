"""The figure both co-location benches draw: one column per arrival pattern, rows for online TTFT,
online TBT and offline throughput over time, one colour per configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

CONFIG_COLORS = {"online-only": "black", "hygen": "tab:blue", "echo": "tab:purple", "bros": "tab:red",
                 "hygen-star": "tab:orange", "sglang-priority-searched": "tab:green",
                 "sglang-priority-unbounded": "tab:olive", "sglang-priority-online-only": "tab:gray"}


def latency_figure(columns: int) -> tuple[Any, Any]:
    """A 3-row figure with ``columns`` columns (sharing their time axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(3, columns, figsize=(max(6 * columns, 11), 9), sharex="col", squeeze=False)


def plot_online(axes: Any, column: int, config: str, points: Sequence[dict[str, Any]], marker_size: float) -> None:
    """TTFT and TBT of each online request (points with ``t``, ``ttft``, ``tbt`` in seconds)."""
    online = [point for point in points if point["ttft"] is not None]
    axes[0, column].plot([p["t"] for p in online], [p["ttft"] * 1000 for p in online], ".", ms=marker_size,
                         color=CONFIG_COLORS[config], label=config)
    with_tbt = [point for point in online if point["tbt"] is not None]
    axes[1, column].plot([p["t"] for p in with_tbt], [p["tbt"] * 1000 for p in with_tbt], ".", ms=marker_size,
                         color=CONFIG_COLORS[config])


def label_column(axes: Any, column: int, title: str, throughput_label: str, time_label: str) -> None:
    axes[0, column].set_title(title)
    axes[0, column].set_ylabel("TTFT (ms)")
    axes[0, column].set_yscale("log")
    axes[1, column].set_ylabel("mean TBT per request (ms)")
    axes[1, column].set_yscale("log")
    axes[2, column].set_ylabel(throughput_label)
    axes[2, column].set_yscale("symlog", linthresh=10)  # searched baselines run ~1% of the unbounded rate
    axes[2, column].set_ylim(bottom=0)
    axes[2, column].set_xlabel(time_label)


def save_figure(fig: Any, axes: Any, title: str, path: Path) -> None:
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
