"""The paper's Figure 10: compute and memory time per step, one panel per policy.

Steps are binned, a closed-form decode stretch spread evenly over the steps it stands for (so a
bin narrower than a stretch shows the stretch's mean, not a gap), and a 400K-request run draws
as quickly as a small one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sgl_blend.sim.metrics import SimResult

BINS = 600


def binned(result: SimResult, bins: int = BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step at bin centre, mean compute ms per step, mean memory ms per step)."""
    ends = np.concatenate([[0.0], np.cumsum(np.asarray(result.trace.steps, dtype=float))])
    edges = np.linspace(0, ends[-1], bins + 1)
    width = np.diff(edges)

    def per_step(values) -> np.ndarray:
        running = np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])
        return np.diff(np.interp(edges, ends, running)) / width * 1e3

    return (edges[:-1] + edges[1:]) / 2, per_step(result.trace.comp), per_step(result.trace.mem)


def plot_steps(series: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], path: Path, title: str) -> Path:
    """One panel per policy from its `binned` trace (binned first, so a run's full trace need not
    be kept, or sent back from a worker process, just to be drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 1, figsize=(9, 2.4 * len(series)), squeeze=False)
    for axis, (name, (step, comp, mem)) in zip(axes[:, 0], series.items()):
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
