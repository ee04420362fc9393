"""The paper's Figure 10: compute and memory time per step, one panel per policy.

Steps are binned (a closed-form decode stretch spreads over the steps it stands for), so a
400K-request run draws as quickly as a small one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sgl_blend.sim.metrics import SimResult

BINS = 600


def binned(result: SimResult, bins: int = BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step at bin centre, mean compute ms per step, mean memory ms per step)."""
    steps = np.asarray(result.trace.steps, dtype=float)
    ends = np.cumsum(steps)
    edges = np.linspace(0, ends[-1], bins + 1)
    which = np.clip(np.searchsorted(edges, ends - steps / 2, side="right") - 1, 0, bins - 1)
    count = np.bincount(which, weights=steps, minlength=bins)
    comp = np.bincount(which, weights=np.asarray(result.trace.comp), minlength=bins)
    mem = np.bincount(which, weights=np.asarray(result.trace.mem), minlength=bins)
    safe = np.maximum(count, 1)
    return (edges[:-1] + edges[1:]) / 2, comp / safe * 1e3, mem / safe * 1e3


def plot_steps(results: dict[str, SimResult], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.4 * len(results)), squeeze=False)
    for axis, (name, result) in zip(axes[:, 0], results.items()):
        step, comp, mem = binned(result)
        axis.plot(step, comp, label="compute time", color="tab:red", linewidth=0.8)
        axis.plot(step, mem, label="memory time", color="tab:blue", linewidth=0.8)
        axis.set_ylabel(f"{name}\nms / step")
        axis.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
