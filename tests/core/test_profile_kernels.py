"""`sgl-blend profile` measures this CPU with torch and writes a profile the cost model loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec


def test_profile_writes_a_loadable_hardware_spec(tmp_path: Path) -> None:
    out = tmp_path / "hw.json"
    result = subprocess.run([sys.executable, "-m", "sgl_blend.cli", "profile", "--out", str(out), "--quick"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "decode_attention" in result.stdout and "gemm" in result.stdout
    spec = HardwareSpec.resolve(str(out))
    assert spec.name == "cpu" and spec.flops > 0 and spec.bandwidth > 0 and spec.kv_memory_bytes > 0
    table = json.loads(out.read_text())["table"]
    assert {row["op"] for row in table} == {"gemm", "decode_attention"}
    assert all(row["measured_ms"] > 0 for row in table)
    assert CostModel(model_spec("llama-3.1-8b"), spec).kv_capacity_tokens() > 0
