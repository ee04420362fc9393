"""`sgl-blend models prepare` builds once; a second run is a no-op that leaves the files untouched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def prepare(cache_dir: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "sgl_blend.cli", "models", "prepare", "tiny-llama", "--cache-dir", str(cache_dir)],
        capture_output=True, text=True, timeout=300, check=True,
    )
    return result.stdout


def snapshot(directory: Path) -> dict[str, int]:
    return {str(path.relative_to(directory)): path.stat().st_mtime_ns for path in directory.rglob("*")}


def test_prepare_twice_is_a_no_op(tmp_path: Path) -> None:
    assert "built in" in prepare(tmp_path)
    model = tmp_path / "models" / "tiny-llama"
    before = snapshot(model)
    assert "already prepared" in prepare(tmp_path)
    assert snapshot(model) == before
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (model / "tokenizer.json").is_file()
    assert "chat_template" in json.loads((model / "tokenizer_config.json").read_text()) or (model / "chat_template.jinja").is_file()


def test_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sgl_blend.cli", "models", "prepare", "gpt-5", "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "unknown model" in result.stderr
