"""The prepared GPU check (`scripts/gpu-check.sh`, `bench.gpu_check`) keeps working between GPU loans.

No GPU is lent to CI, so its dry run -- the very same steps on the emulated H100, small files --
runs here: every case must come back with figures, or the first GPU loan would find the check broken.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench import gpu_check

ROOT = Path(__file__).resolve().parents[2]
# Figures every case must report above zero: the batch cases' rates and cache hits, the co-location
# case's online latencies and offline throughput.
BATCH_FIGURES = ("lines_per_s", "tokens_per_s", "cached_tokens")
COLOCATION_FIGURES = ("tokens_per_s", "ttft_p99_ms", "tbt_p99_ms")


@pytest.mark.server
@pytest.mark.timeout(1800)
def test_dry_run_reports_every_case(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    report = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert list(report["cases"]) == list(gpu_check.STEPS), done.stdout[-3000:]
    for name, case in report["cases"].items():
        assert case["status"] == "ok", f"{name}: {json.dumps(case, indent=2)}"
        figures = COLOCATION_FIGURES if name == gpu_check.COLOCATION else BATCH_FIGURES
        assert all(case[key] > 0 for key in figures), f"{name}: {case}"
    assert report["environment"]["dry_run"] is True
    assert (report["model"]["layers"], report["model"]["hidden"], report["model"]["vocab"]) == (32, 4096, 128256)
    markdown = (tmp_path / "out" / "gpu-check.md").read_text()
    assert all(f"| {name} | ok |" in markdown for name in gpu_check.STEPS)
    assert done.returncode == 0, done.stdout[-3000:]


def test_a_failed_step_names_the_stub_kernels_its_server_called(tmp_path: Path) -> None:
    """On a GPU the first run is expected to find CUDA kernels the import stub stands in for: the
    summary must name them, not only say the step failed."""
    (tmp_path / "server.log").write_text(
        "Ignore import error when loading sglang.srt.models.x: noise\n"
        "sgl_kernel.rmsnorm was called, but only sgl-blend's stub of sgl_kernel is installed; ...\n"
    )
    (tmp_path / "step.log").write_text("ServerStartError: SGLang exited with code 1\n")
    failure = gpu_check.step_failure(tmp_path, tmp_path / "step.log")
    assert failure["stub_calls"] == ["sgl_kernel.rmsnorm"]
    assert not any("Ignore import error" in line for line in failure["error_tail"])
    assert "ServerStartError: SGLang exited with code 1" in failure["error_tail"]
