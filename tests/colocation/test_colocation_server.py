"""Co-location in a real SGLang scheduler (tiny-llama, one server for the module, KV pool of 4096
tokens so offline work can fill it): online requests are admitted in the very next iteration
even when offline work saturates the engine, a preempted offline request resumes from its cached
KV and writes exactly what an undisturbed run writes, and settings change at runtime."""

from __future__ import annotations

import concurrent.futures
import json
import random
import urllib.error
import urllib.request
from typing import Any, Iterator

import pytest
import requests

from sgl_blend.launch.colocation import colocation_launch
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.offline import offline_routing_key
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.sglang_plugin.settings import PluginSettings
from tests.conftest import free_port
from tests.waiting import wait_for

KV_TOKENS = 4096
VOCAB = 1024
RESET = "sgl_blend_reset_records"
# A stand-in latency model (1 ms + 10 µs per prefill token): this module checks mechanics, not timing.
MODEL = {"form": "hygen", "coefficients": {"intercept": 1e-3, "S_p": 1e-5, "S_d": 0.0, "S_p^2": 0.0, "S_d^2": 0.0,
                                            "N_p": 0.0, "N_d": 0.0}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    settings = PluginSettings(offline_policy="fcfs", colocation=ColocationConfig(mode="hygen", latency_model=MODEL))
    args = colocation_launch(settings, ["--port", str(free_port()), "--max-total-tokens", str(KV_TOKENS)])
    log = tmp_path_factory.mktemp("colocation") / "server.log"
    process = start_server("tiny-llama", args, log_path=log, settings=settings)
    yield process
    process.stop()


def tokens(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(16, VOCAB - 16) for _ in range(length)]


def generate(server: ServerProcess, input_ids: list[int], max_new_tokens: int, *, offline: bool,
             rid: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"input_ids": input_ids, "return_output_ids": True,
                            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
    if offline:
        body["routing_key"] = offline_routing_key("test")
    if rid:
        body["rid"] = rid
    response = requests.post(f"{server.base_url}/generate", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


def plugin_state(server: ServerProcess) -> dict[str, Any]:
    return requests.get(f"{server.base_url}/server_info", timeout=60).json()["internal_states"][0]["sgl_blend"]


def set_state(server: ServerProcess, settings: dict[str, float]) -> bool:
    body = json.dumps({"server_args": settings}).encode()
    request = urllib.request.Request(f"{server.base_url}/set_internal_state", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return all(json.load(response))


def generate_streaming(server: ServerProcess, input_ids: list[int], max_new_tokens: int, rid: str,
                       progress: list[int]) -> dict[str, Any]:
    """An offline `generate` that streams, so the test sees how many tokens it has decoded so far
    (``progress[0]``, from each chunk's ``completion_tokens``); the last chunk (cumulative output)."""
    body: dict[str, Any] = {"input_ids": input_ids, "return_output_ids": True, "stream": True, "rid": rid,
                            "routing_key": offline_routing_key("test"),
                            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
    last: dict[str, Any] = {}
    with requests.post(f"{server.base_url}/generate", json=body, stream=True, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(b"data:") and line != b"data: [DONE]":
                last = json.loads(line[len(b"data:"):])
                progress[0] = last["meta_info"]["completion_tokens"]
    return last


def test_online_requests_are_admitted_in_the_next_iteration_under_offline_saturation(server: ServerProcess) -> None:
    """Eight offline requests of 400 + 100 tokens reserve ~4000 of the 4096 KV tokens, and more
    wait; each online request (300 + 8 tokens) finds no room and must take it from offline work."""
    assert set_state(server, {RESET: 1})
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        offline = [pool.submit(generate, server, tokens(400, seed), 100, offline=True) for seed in range(12)]
        wait_for(lambda: (plugin_state(server)["offline"] or {}).get("running", 0) >= 6, "six offline requests running")
        online_ids = []
        for index in range(3):
            answer = generate(server, tokens(300, 1000 + index), 8, offline=False)
            online_ids.append(answer["meta_info"]["id"])
            assert len(answer["output_ids"]) == 8
        state = plugin_state(server)
        assert all(future.result()["meta_info"]["completion_tokens"] == 100 for future in offline)
    admissions = {entry["rid"]: entry for entry in state["online_admissions"]}
    assert set(online_ids) <= set(admissions), state["online_admissions"]
    late = [admissions[rid] for rid in online_ids if admissions[rid]["scheduled_in"] != admissions[rid]["arrived_after"] + 1]
    assert not late, late
    assert state["colocation"]["counts"].get("memory_reclaimed", 0) > 0, state["colocation"]["counts"]
    busy = {record["iteration"]: record for record in state["iterations"]}
    first_arrival = busy[admissions[online_ids[0]]["arrived_after"]]
    assert first_arrival["offline_decode"] + first_arrival["offline_prefill"] >= 6, first_arrival


def test_preempted_offline_request_resumes_from_its_cache_with_identical_output(server: ServerProcess) -> None:
    """An offline request that has decoded ``decoded`` tokens when a 3400-token online request needs
    its KV is retracted, resumes from the cached prompt and those tokens, and writes what it
    writes undisturbed."""
    prompt, decoded = tokens(300, 7), 100
    undisturbed = generate(server, prompt, 600, offline=True, rid="undisturbed")
    requests.post(f"{server.base_url}/flush_cache", timeout=60).raise_for_status()
    progress = [0]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        interrupted = pool.submit(generate_streaming, server, prompt, 600, "interrupted", progress)
        wait_for(lambda: progress[0] >= decoded or interrupted.done(), f"the offline request to decode {decoded} tokens")
        online = generate(server, tokens(3400, 8), 8, offline=False)
        resumed = interrupted.result()
    assert len(online["output_ids"]) == 8
    assert resumed["output_ids"] == undisturbed["output_ids"]
    assert resumed["meta_info"]["num_retractions"] >= 1
    resumes = [entry for entry in plugin_state(server)["colocation"]["resumes"] if entry["rid"] == "interrupted"]
    assert resumes and all(entry["resumed_prefix"] > 0 for entry in resumes), resumes
    assert resumes[0]["resumed_prefix"] >= len(prompt) + decoded, resumes  # the decoded tokens' KV was kept too


def test_settings_change_at_runtime_and_bad_ones_are_refused(server: ServerProcess) -> None:
    assert not set_state(server, {"sgl_blend_latency_budget_s": -1})
    assert not set_state(server, {"sgl_blend_no_such_setting": 1})
    assert not set_state(server, {"sgl_blend_min_offline_chunk": 0})
    assert set_state(server, {"sgl_blend_latency_budget_s": 0.05, RESET: 1})
    assert plugin_state(server)["colocation"]["latency_budget_s"] == 0.05
    generate(server, tokens(64, 9), 4, offline=True)
    records = plugin_state(server)["iterations"]
    assert records and all(record["latency_budget_s"] == 0.05 and record["predicted_s"] > 0 for record in records)
    assert set_state(server, {"sgl_blend_clear_latency_budget": 1})
    assert plugin_state(server)["colocation"]["latency_budget_s"] is None
