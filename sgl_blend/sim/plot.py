"""The paper's Figure 10: compute and memory time per step, one panel per policy."""

from __future__ import annotations

from pathlib import Path

from sgl_blend.sim.engine import SimResult


def plot_steps(results: dict[str, SimResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.4 * len(results)), squeeze=False, sharex=True)
    for axis, (name, result) in zip(axes[:, 0], results.items()):
        comp = [step[0] * 1e3 for step in result.steps]
        mem = [step[1] * 1e3 for step in result.steps]
        axis.plot(comp, label="compute time", color="tab:blue", linewidth=0.8)
        axis.plot(mem, label="memory time", color="tab:orange", linewidth=0.8)
        axis.set_ylabel(f"{name}\nms / step")
        axis.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("recorded step")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
