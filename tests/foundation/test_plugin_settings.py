"""The one settings variable a launcher passes to the plugin in SGLang's scheduler."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.sglang_plugin.settings import SETTINGS_ENV, PluginSettings, SettingsError

MODEL = {"form": "hygen", "coefficients": {"intercept": 1e-3, "S_p": 1e-5, "S_d": 0.0, "S_p^2": 0.0, "S_d^2": 0.0,
                                            "N_p": 0.0, "N_d": 0.0}}


def test_settings_round_trip_through_their_one_variable() -> None:
    settings = PluginSettings(offline_policy="psm", hardware="h100-sxm", psm_utility=0.7, record_policy_calls=True,
                              colocation=ColocationConfig(mode="hygen", latency_budget_s=0.05, latency_model=MODEL),
                              iteration_log="/tmp/records.jsonl")
    env = settings.to_env()
    assert list(env) == [SETTINGS_ENV]
    assert PluginSettings.from_env(env) == settings
    assert PluginSettings.from_env({}) == PluginSettings()
    assert PluginSettings.from_env({SETTINGS_ENV: json.dumps({"offline_policy": "off"})}).pool_enabled is False


@pytest.mark.parametrize(("value", "names"), [
    ("{not json", "SGLBLEND_SETTINGS"),
    ("[1, 2]", "JSON object"),
    ('{"offline_policy": "fcfs", "policy": "dfs"}', "unknown settings: policy"),
    ('{"psm_utility": 2}', "psm_utility"),
    ('{"record_policy_calls": "1"}', "record_policy_calls"),
    ('{"hardware": ""}', "hardware"),
    ('{"colocation": {"mode": "hygen", "latency_budget_s": 0.01}}', "colocation: a latency budget needs"),
    ('{"colocation": {"mode": "nope"}}', "unknown co-location mode"),
])
def test_a_malformed_variable_is_refused_with_what_is_wrong(value: str, names: str) -> None:
    with pytest.raises(SettingsError, match=SETTINGS_ENV) as error:
        PluginSettings.from_env({SETTINGS_ENV: value})
    assert names in str(error.value)


def test_launchers_import_the_settings_without_sglang() -> None:
    code = ("import sys; import sgl_blend.sglang_plugin.settings, sgl_blend.launch.supervisor; "
            "print(any(name.split('.')[0] == 'sglang' for name in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
