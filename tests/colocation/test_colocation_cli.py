"""Bad co-location input is refused before any server starts, with a message that says why.

The commands run in this process (`sgl_blend.cli.main`): a refusal that regressed into starting a
server would fail at once, since tests/conftest.py lets only tests marked ``server`` start one."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import Iterator

import pytest

from sgl_blend.cli import main
from sgl_blend.launch.colocation_flags import add_colocation_arguments, colocation_config

LINEAR_FIT = {"form": "hygen", "coefficients": {name: 0.0 for name in
                                                ("intercept", "S_p", "S_d", "S_p^2", "S_d^2", "N_p", "N_d")}}


@pytest.fixture(autouse=True)
def keep_sigterm_handler() -> Iterator[None]:
    """`serve` installs its own SIGTERM handler as it starts; this process keeps pytest's."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run the command; it must exit with 2 (a usage error); its stderr."""
    assert main(list(args)) == 2
    return capsys.readouterr().err


def test_serve_refuses_a_budget_without_a_latency_model(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, "serve", "--model", "tiny-llama", "--colocation", "hygen", "--latency-budget-ms", "20")
    assert "needs a fitted latency model" in err and "profile --latency" in err


def test_a_headroom_makes_a_hygen_budget_by_state_and_needs_a_latency_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, "serve", "--model", "tiny-llama", "--headroom-ms", "2")
    assert "needs a fitted latency model" in err
    model = tmp_path / "fit.json"
    model.write_text(json.dumps(LINEAR_FIT))
    parser = argparse.ArgumentParser()
    add_colocation_arguments(parser)
    config = colocation_config(parser.parse_args(["--headroom-ms", "2", "--tpot-slo-ms", "40", "--ttft-slo-ms", "300",
                                                  "--idle-budget-ms", "5", "--latency-model", str(model)]))
    assert (config.mode, config.latency_budget_s, config.headroom_s) == ("hygen", None, 0.002)
    assert (config.tpot_slo_s, config.ttft_slo_s, config.idle_budget_s) == (0.04, 0.3, 0.005)
    assert config.bros_tail_quantile is None  # BROS plans to the mean unless asked
    bros = colocation_config(parser.parse_args(["--colocation", "bros", "--bros-tail-quantile", "0.99",
                                                "--latency-model", str(model)]))
    assert (bros.mode, bros.bros_tail_quantile) == ("bros", 0.99)
    with pytest.raises(ValueError, match="bros_tail_quantile must be in"):
        colocation_config(parser.parse_args(["--colocation", "bros", "--bros-tail-quantile", "1",
                                             "--latency-model", str(model)]))


def test_serve_refuses_echo_without_deadlines_and_a_bad_slo_file(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "fit.json"
    model.write_text(json.dumps(LINEAR_FIT))
    err = refused(capsys, "serve", "--model", "tiny-llama", "--colocation", "echo", "--latency-model", str(model))
    assert "echo mode needs ttft_slo_s and tpot_slo_s" in err
    broken = tmp_path / "slo.json"
    broken.write_text("{not json")
    assert "cannot read --slo-file" in refused(capsys, "serve", "--model", "tiny-llama", "--slo-file", str(broken))


def test_tune_slo_checks_its_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"t": 0.0, "prompt": "hi", "max_tokens": 4}\n{"t": 1.0, "prompt": "hi"}\n')
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/completions", '
                     '"body": {"model": "m", "prompt": "x", "max_tokens": 4}}\n')
    model = tmp_path / "fit.json"
    model.write_text(json.dumps({"form": "bros", "coefficients": {}}))
    base = ["tune-slo", "--online-trace", str(trace), "--offline-file", str(batch), "--latency-model", str(model)]
    assert "give at least one SLO" in refused(capsys, *base)
    assert "lacks coefficient" in refused(capsys, *base, "--tbt-p99", "0.05")
    model.write_text(json.dumps({"form": "bros", "coefficients": {name: 0.0 for name in (
        "b_prefill", "a0_prefill", "a1_prefill", "b_decode", "a0_decode", "a1_decode")}}))
    assert "trace.jsonl:2" in refused(capsys, *base, "--tbt-p99", "0.05")


def test_a_missing_required_flag_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["tune-slo", "--online-trace", "t.jsonl"])
    assert exit_.value.code == 2
    assert "the following arguments are required: --offline-file, --latency-model" in capsys.readouterr().err
