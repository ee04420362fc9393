"""`sgl-blend profile` and the calibration kernels: this CPU measured with torch, profiles the cost model
loads, and the co-run fit that gives the simulator its interference constant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sgl_blend.cli import main
from sgl_blend.kernels.corun import CorunSample, fit_report, measure_corun
from sgl_blend.kernels.transfer import measure_transfers, peak_bandwidth
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec


def test_profile_writes_a_loadable_hardware_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hw.json"
    assert main(["profile", "--out", str(out), "--quick"]) == 0
    printed = capsys.readouterr().out
    assert "decode_attention" in printed and "gemm" in printed
    spec = HardwareSpec.resolve(str(out))
    assert spec.name == "cpu" and spec.flops > 0 and spec.bandwidth > 0 and spec.kv_memory_bytes > 0
    table = json.loads(out.read_text())["table"]
    assert {row["op"] for row in table} == {"gemm", "decode_attention"}
    assert all(row["measured_ms"] > 0 for row in table)
    assert CostModel(model_spec("llama-3.1-8b"), spec).kv_capacity_tokens() > 0


def test_corun_fit_recovers_a_known_interference_constant() -> None:
    samples = [CorunSample(0, 0, 0, gemm, attention, max(gemm, attention) + 0.3 * min(gemm, attention))
               for gemm, attention in ((1.0, 0.2), (0.5, 0.9), (0.3, 0.3), (2.0, 1.1), (0.1, 0.7))]
    report = fit_report(samples)
    assert report["naive"]["interference"]["lambda"] == pytest.approx(0.3)
    assert report["naive"]["interference"]["mean_abs_error"] == pytest.approx(0.0, abs=1e-12)
    assert "partitioned" not in report


def test_cpu_corun_and_copies_are_measured() -> None:
    sample = measure_corun(16, 2, 256, torch.device("cpu"), torch.float32, hidden=256, ffn=512, loops=2, repeats=2)
    assert sample.gemm_s > 0 and sample.attention_s > 0 and sample.together_s > 0
    transfers = measure_transfers(torch.device("cpu"), (1,))
    assert {t.direction for t in transfers} == {"host_to_device", "device_to_host"}
    assert peak_bandwidth(transfers, "host_to_device") > 0
