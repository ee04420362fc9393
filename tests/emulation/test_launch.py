"""An emulated launch: the stand-in SGLang loads, the sizing flags it gets, TP priced and not run, and
the plugin settings that carry the emulation (through `serve --emulate` too). Nothing starts."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from sgl_blend.launch.flags import with_defaults

from sgl_blend.cli import main
from sgl_blend.emulation.config import EmulationConfig
from sgl_blend.emulation.launch import emulated_launch, emulated_token
from sgl_blend.emulation.memory import engine_sizing
from sgl_blend.emulation.devices import resolve_device
from sgl_blend.launch import supervisor
from sgl_blend.launch.flags import flag_value
from sgl_blend.models.llama31 import LLAMA_31_8B
from sgl_blend.models.registry import STAND_IN, model_dir
from sgl_blend.sglang_plugin.settings import PluginSettings, SettingsError


def test_a_named_model_runs_as_the_stand_in_sized_as_sglang_sizes_it() -> None:
    plan = emulated_launch("h100", "llama-3.1-8b", ["--enable-mixed-chunk", "--tp-size", "2", "--port", "1"])
    sizing = engine_sizing(LLAMA_31_8B, resolve_device("h100").memory, tp=2)
    assert plan.model_path == model_dir(STAND_IN)
    assert plan.sizing == sizing
    assert "--tp-size" not in plan.sglang_args and "--enable-mixed-chunk" in plan.sglang_args
    assert flag_value(plan.sglang_args, "--max-total-tokens") == str(sizing.max_total_tokens)
    assert flag_value(plan.sglang_args, "--max-running-requests") == str(sizing.max_running_requests)
    assert flag_value(plan.sglang_args, "--chunked-prefill-size") == "8192"
    assert plan.emulation == EmulationConfig("h100", "llama-3.1-8b", 2, emulated_token(plan.model_path))
    settings = plan.settings_for(PluginSettings(offline_policy="dfs"))
    assert (settings.emulation, settings.hardware, settings.offline_policy) == (plan.emulation, "h100-sxmx2", "dfs")
    assert plan.settings_for(PluginSettings(hardware="a100-80g")).hardware == "a100-80g"


def test_user_sizing_flags_are_honoured_once() -> None:
    plan = emulated_launch("a100-80g", "llama-3.1-8b", ["--max-total-tokens=30000", "--mem-fraction-static", "0.7",
                                                      "--chunked-prefill-size", "2048"])
    assert plan.sizing.max_total_tokens == 30000
    assert plan.sizing.mem_fraction_static == 0.7
    args = plan.sglang_args
    assert [args.count(flag) for flag in ("--max-total-tokens", "--chunked-prefill-size")] == [1, 1]
    assert "--mem-fraction-static" not in args and "--max-total-tokens=30000" not in args
    assert flag_value(args, "--chunked-prefill-size") == "2048"


def test_the_emulated_token_is_one_ordinary_word() -> None:
    from transformers import AutoTokenizer

    path = model_dir(STAND_IN)
    token = emulated_token(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    assert tokenizer.decode([token] * 3) == " the the the"
    assert token not in tokenizer.all_special_ids


def test_the_cpu_runs_a_real_model_and_keeps_its_own_settings() -> None:
    plan = emulated_launch("cpu", "tiny-llama", ["--port", "1"])
    assert plan.sizing is None and plan.sglang_args == ["--port", "1"]
    assert plan.emulation == EmulationConfig("cpu", str(model_dir("tiny-llama")), 1)
    assert plan.settings_for(PluginSettings()).hardware == "cpu"
    with pytest.raises(ValueError, match="runs the real model"):
        emulated_launch("cpu", "llama-3.1-8b")


def test_unknown_devices_and_profiles_without_memory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown device"):
        emulated_launch("tpu", "llama-3.1-8b")
    profile = tmp_path / "hw.json"
    profile.write_text('{"name": "x", "flops": 1e15, "bandwidth": 3e12, "kv_memory_bytes": 1e10}')
    with pytest.raises(ValueError, match="memory_total_mib"):
        emulated_launch(str(profile), "llama-3.1-8b")


def test_a_profile_with_its_memory_prices_and_sizes(tmp_path: Path) -> None:
    profile = tmp_path / "hw.json"
    profile.write_text('{"name": "measured", "flops": 7.7e14, "bandwidth": 2.97e12, "kv_memory_bytes": 1e10, '
                       '"memory_total_mib": 81559, "memory_usable_gib": 79.11}')
    plan = emulated_launch(str(profile), "llama-3.1-8b")
    assert plan.sizing == engine_sizing(LLAMA_31_8B, resolve_device("h100").memory)
    assert plan.hardware == str(profile)


def test_the_emulation_travels_in_the_plugin_settings() -> None:
    settings = PluginSettings(emulation=EmulationConfig("a100-80g", "llama-3.1-70b", 8, 260))
    assert PluginSettings.from_env(settings.to_env()) == settings
    assert PluginSettings.from_env(PluginSettings().to_env()).emulation is None
    for bad in ({"device": "h100", "model": "m"}, {"device": "cpu", "model": "m", "token_id": 3},
                {"device": "h100", "model": "m", "token_id": 1, "tp": 0}, {"device": "h100", "model": "m", "x": 1}):
        with pytest.raises(SettingsError, match="emulation"):
            PluginSettings.from_dict({"emulation": bad})


@pytest.fixture
def captured_start(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """`serve` with SGLang's start replaced by a record of what it would start."""
    handler = signal.getsignal(signal.SIGTERM)
    seen: dict[str, Any] = {}

    def record(model: str, sglang_args: list[str], **kwargs: Any) -> SimpleNamespace:
        seen.update(model=model, sglang_args=sglang_args, **kwargs)
        return SimpleNamespace(base_url="http://127.0.0.1:1", process=SimpleNamespace(pid=1))

    monkeypatch.setattr(supervisor, "start_server", record)
    yield seen
    signal.signal(signal.SIGTERM, handler)


def test_serve_emulate_starts_the_emulated_launch(captured_start: dict[str, Any],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "llama-3.1-70b", "--emulate", "h100", "--tp-size", "8", "--no-batch-api",
                 "--detach", "--enable-mixed-chunk"]) == 0
    plan = emulated_launch("h100", "llama-3.1-70b", ["--tp-size", "8", "--enable-mixed-chunk"])
    assert captured_start["model"] == str(plan.model_path)
    assert captured_start["sglang_args"] == with_defaults(plan.sglang_args,
                                                          plan.settings_for(PluginSettings()).sglang_flags())
    assert captured_start["settings"].emulation == plan.emulation
    assert "emulating h100 running llama-3.1-70b at TP 8" in capsys.readouterr().out


def test_serve_refuses_an_emulation_it_cannot_run(captured_start: dict[str, Any],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "llama-3.1-8b", "--emulate", "cpu", "--no-batch-api"]) == 2
    assert "runs the real model" in capsys.readouterr().err
    assert not captured_start
