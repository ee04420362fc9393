"""Bad co-location input is refused before any server starts, with a message that says why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def sgl_blend(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sgl_blend.cli", *args], capture_output=True, text=True, timeout=120)


def test_serve_refuses_a_budget_without_a_latency_model() -> None:
    result = sgl_blend("serve", "--model", "tiny-llama", "--colocation", "hygen", "--latency-budget-ms", "20")
    assert result.returncode == 2
    assert "needs a fitted latency model" in result.stderr and "profile --latency" in result.stderr


def test_serve_refuses_echo_without_deadlines_and_a_bad_slo_file(tmp_path: Path) -> None:
    model = tmp_path / "fit.json"
    model.write_text(json.dumps({"form": "hygen", "coefficients": {name: 0.0 for name in
                                 ("intercept", "S_p", "S_d", "S_p^2", "S_d^2", "N_p", "N_d")}}))
    result = sgl_blend("serve", "--model", "tiny-llama", "--colocation", "echo", "--latency-model", str(model))
    assert result.returncode == 2 and "echo mode needs ttft_slo_s and tpot_slo_s" in result.stderr
    broken = tmp_path / "slo.json"
    broken.write_text("{not json")
    result = sgl_blend("serve", "--model", "tiny-llama", "--slo-file", str(broken))
    assert result.returncode == 2 and "cannot read --slo-file" in result.stderr


def test_tune_slo_checks_its_inputs(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"t": 0.0, "prompt": "hi", "max_tokens": 4}\n{"t": 1.0, "prompt": "hi"}\n')
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/completions", '
                     '"body": {"model": "m", "prompt": "x", "max_tokens": 4}}\n')
    model = tmp_path / "fit.json"
    model.write_text(json.dumps({"form": "bros", "coefficients": {}}))
    base = ["tune-slo", "--online-trace", str(trace), "--offline-file", str(batch), "--latency-model", str(model)]
    assert "give at least one SLO" in sgl_blend(*base).stderr
    result = sgl_blend(*base, "--tbt-p99", "0.05")
    assert result.returncode == 2 and "lacks coefficient" in result.stderr
    model.write_text(json.dumps({"form": "bros", "coefficients": {name: 0.0 for name in (
        "b_prefill", "a0_prefill", "a1_prefill", "b_decode", "a0_decode", "a1_decode")}}))
    result = sgl_blend(*base, "--tbt-p99", "0.05")
    assert result.returncode == 2 and "trace.jsonl:2" in result.stderr
