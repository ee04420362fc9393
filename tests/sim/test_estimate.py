"""`sgl-blend estimate`: its arithmetic on a hand-built job, and the command on a small file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_blend.core.cost_model import CostModel
from sgl_blend.sim.estimate import estimate, table
from sgl_blend.sim.metrics import workload_bound
from sgl_blend.forward_time.overlap import hardware_overlap
from sgl_blend.sim.run import simulate
from sgl_blend.sim.sizing import stock_engine
from sgl_blend.sim.workload import SimRequest, chain_hash

ENGINE = stock_engine("llama-3.1-8b", "h100")


def job() -> list[SimRequest]:
    """Ten requests under one 500-token prefix, ten unique ones with long outputs."""
    prefix = ((chain_hash("", "few-shot"), 500),)
    shared = [SimRequest(f"s{i}", "t", prefix, 20, 2, 2, True) for i in range(10)]
    unique = [SimRequest(f"u{i}", "t", (), 300, 800 + 10 * i, 800 + 10 * i, True) for i in range(10)]
    return [request for pair in zip(shared, unique) for request in pair]


def test_the_report_is_the_simulated_run_and_the_papers_bound() -> None:
    requests = job()
    report = estimate(requests, ENGINE, ["blendserve", "lpm"])
    cost, overlap = CostModel(ENGINE.model, ENGINE.hardware), hardware_overlap(ENGINE.hardware)
    t_comp = sum(cost.comp_time(r.prompt_len, r.output_len) for r in requests)
    t_mem = sum(cost.mem_time(r.prompt_len, r.output_len) for r in requests)
    sharing = 9 * 500 / sum(r.prompt_len for r in requests)
    bound = report["bound"]
    assert bound["max_sharing"] == pytest.approx(sharing)
    assert bound["max_saved_prompt_tokens"] == 9 * 500
    assert bound["t_o_ideal_seconds"] == pytest.approx(max((1 - sharing) * t_comp, t_mem))
    assert bound["t_o_seconds"] == pytest.approx(workload_bound(requests, cost, overlap).t_o)
    tokens = sum(r.prompt_len + r.output_len for r in requests)
    assert (report["prompt_tokens"], report["output_tokens"]) == (sum(r.prompt_len for r in requests),
                                                                   sum(r.output_len for r in requests))
    for name, entry in report["policies"].items():
        run = simulate(requests, name, ENGINE.model, ENGINE.hardware, overlap, config=ENGINE.config)
        assert entry["seconds"] == run.seconds
        assert entry["tokens_per_s"] == pytest.approx(tokens / run.seconds)
        assert entry["fraction_of_t_o"] == pytest.approx(bound["t_o_seconds"] / run.seconds)
        assert entry["saved_prompt_tokens"] == run.cached_tokens <= bound["max_saved_prompt_tokens"]
    assert "blendserve:" in table(report) and "x lpm" in table(report)


def test_the_command_prices_a_batch_file(tmp_path: Path, capsys) -> None:
    from sgl_blend.cli import main

    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "max_tokens": 50 + 40 * i, "ignore_eos": True,
                       "messages": [{"role": "system", "content": "You grade answers. " * 40},
                                    {"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]}}
             for i in range(12)]
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}})
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["estimate", "-i", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 12 and report["invalid_lines"] == 1 and report["output_tokens"] == sum(
        50 + 40 * i for i in range(12))
    assert set(report["policies"]) == {"blendserve", "lpm"}
    assert report["bound"]["max_sharing"] > 0.5, "the shared system prompt"
    assert report["policies"]["blendserve"]["saved_prompt_tokens"] > 0
    assert main(["estimate", "-i", str(path)]) == 0
    assert "T_o bound" in capsys.readouterr().out
