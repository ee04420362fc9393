"""`sgl-blend models prepare` builds once; a second run is a no-op that leaves the files untouched.
The command runs in this process (`sgl_blend.cli.main`); `test_entry_point` covers the installed script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_blend.cli import main


def prepare(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["models", "prepare", "tiny-llama", "--cache-dir", str(cache_dir)]) == 0
    return capsys.readouterr().out


def snapshot(directory: Path) -> dict[str, int]:
    return {str(path.relative_to(directory)): path.stat().st_mtime_ns for path in directory.rglob("*")}


def test_prepare_twice_is_a_no_op(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "built in" in prepare(tmp_path, capsys)
    model = tmp_path / "models" / "tiny-llama"
    before = snapshot(model)
    assert "already prepared" in prepare(tmp_path, capsys)
    assert snapshot(model) == before
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (model / "tokenizer.json").is_file()
    assert "chat_template" in json.loads((model / "tokenizer_config.json").read_text()) or (model / "chat_template.jinja").is_file()


def test_unknown_model_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "prepare", "gpt-5", "--cache-dir", str(tmp_path)]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()


def test_an_unknown_choice_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["models", "path", "gpt-5"])
    assert exit_.value.code == 2 and "invalid choice: 'gpt-5'" in capsys.readouterr().err
