"""`sgl-blend sim --workload FILE`: an OpenAI batch file runs as `sgl-blend estimate` prices it,
and a workload JSONL still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_blend.cli import main

POLICIES = "blendserve,lpm"


def batch_file(path: Path) -> Path:
    """Twelve chat lines under one system prompt, four unique ones, and a line that cannot run."""
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "max_tokens": 8 + i, "ignore_eos": True,
                       "messages": [{"role": "system", "content": "You grade answers. " * 60},
                                    {"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]}}
             for i in range(12)]
    lines += [{"custom_id": f"u{i}", "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "m", "max_tokens": 300 + 50 * i, "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"Write story number {i} about a {i}-legged cat."}]}}
              for i in range(4)]
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run_json(argv: list[str], capsys) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sim_runs_a_batch_file_as_estimate_prices_it(tmp_path: Path, capsys) -> None:
    path = batch_file(tmp_path / "batch.jsonl")
    sim = run_json(["sim", "--workload", str(path), "--device", "h100", "--policy", POLICIES], capsys)
    estimate = run_json(["estimate", "-i", str(path), "--device", "h100", "--policy", POLICIES], capsys)
    assert sim["requests"] == estimate["requests"] == 16
    assert sim["invalid_lines"] == estimate["invalid_lines"] == 1
    assert sim["bound"]["sharing"] == pytest.approx(estimate["bound"]["max_sharing"], abs=1e-4)
    assert sim["bound"]["sharing"] > 0.5, "the shared system prompt"
    for name in POLICIES.split(","):
        assert sim["policies"][name]["seconds"] == pytest.approx(estimate["policies"][name]["seconds"], abs=1e-3)
        assert sim["policies"][name]["sharing_ratio"] == pytest.approx(
            estimate["policies"][name]["cache_hit_ratio"], abs=1e-4)


def test_a_saved_workload_still_loads_as_one(tmp_path: Path, capsys) -> None:
    path = batch_file(tmp_path / "batch.jsonl")
    saved = tmp_path / "workload.jsonl"
    first = run_json(["sim", "--workload", str(path), "--device", "h100", "--policy", "dfs",
                      "--save-workload", str(saved)], capsys)
    again = run_json(["sim", "--workload", str(saved), "--device", "h100", "--policy", "dfs"], capsys)
    assert again["policies"] == first["policies"]
    header = json.loads(saved.read_text().splitlines()[0])
    assert header["workload"]["batch_file"] == str(path), "the saved workload says where it came from"


def test_a_missing_file_is_an_error(tmp_path: Path, capsys) -> None:
    assert main(["sim", "--workload", str(tmp_path / "absent.jsonl")]) == 2
    assert "is not a file" in capsys.readouterr().err
