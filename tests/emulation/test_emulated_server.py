"""A real SGLang server emulating an H100 running Llama-3.1-8B: SGLang schedules for real, the clock
advances by exactly the priced shapes SGLang ran, outputs follow max_tokens, the KV pool is SGLang's
own sizing of that model on that device, and idle time accrues while nothing runs."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.emulation.clock_reader import ClockReading, emulated_seconds, read_clock
from sgl_blend.emulation.devices import H100_TOTAL_MIB, H100_USABLE_GIB, DeviceMemory
from sgl_blend.emulation.launch import EmulatedLaunch, emulated_launch
from sgl_blend.emulation.memory import engine_sizing
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.models.llama31 import LLAMA_31_8B
from sgl_blend.sglang_plugin.settings import PluginSettings
from sgl_blend.forward_time.overlap import overlap_function
from sgl_blend.forward_time.step_time import StepTime
from tests.conftest import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.server

CHUNK = 8192
# Llama-3.1-8B priced on the built-in H100 with the two-stream overlap of a stock engine.
STEP = StepTime.of(CostModel(model_spec("llama-3.1-8b"), HardwareSpec.resolve("h100-sxm")),
                   overlap_function("interference", 0.90))


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, EmulatedLaunch]]:
    plan = emulated_launch("h100", "llama-3.1-8b", ["--port", str(free_port()), "--enable-mixed-chunk"])
    log = Path(tmp_path_factory.mktemp("emulated-h100")) / "server.log"
    server = start_server(str(plan.model_path), plan.sglang_args, settings=plan.settings_for(PluginSettings()),
                          log_path=log)
    yield server, plan
    server.stop()


def generate(server: ServerProcess, input_ids: list[int], max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    response = requests.post(f"{server.base_url}/generate", timeout=600, json={
        "input_ids": input_ids, **extra,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}})
    response.raise_for_status()
    return response.json()


def new_forwards(before: ClockReading, after: ClockReading, *, kept_only: bool = False) -> list[dict[str, Any]]:
    """The forwards between two readings, from the clock's recent window; ``kept_only``: those of
    them still in it (the window keeps the last `RECENT_FORWARDS`), else all of them, asserted."""
    state, old = after.ranks[0], before.ranks[0]
    recent = state["recent"]
    count = state["forwards"] - old["forwards"]
    assert kept_only or count <= len(recent), f"{count} forwards, the clock keeps {len(recent)}"
    return recent[max(len(recent) - count, 0):]


def prefill_chunks(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [tuple(chunk) for record in records for chunk in record["shape"]["prefill_chunks"]]


def test_kv_pool_and_limits_are_sglangs_sizing_of_the_model_on_the_device(emulated) -> None:
    server, plan = emulated
    sizing = engine_sizing(LLAMA_31_8B, DeviceMemory(H100_TOTAL_MIB, H100_USABLE_GIB), tp=1)
    assert plan.sizing == sizing
    state = requests.get(f"{server.base_url}/server_info", timeout=60).json()["internal_states"][0]
    assert state["memory_usage"]["token_capacity"] == sizing.max_total_tokens
    assert state["effective_max_running_requests_per_dp"] == sizing.max_running_requests
    assert state["chunked_prefill_size"] == sizing.chunked_prefill_size == CHUNK
    emulation = state["sgl_blend"]["emulation"]
    assert (emulation["device"], emulation["hardware"], emulation["model_shape"], emulation["tp"]) == (
        "h100", "h100-sxm", "llama-3.1-8b", 1)


def test_idle_time_accrues_while_nothing_runs(emulated) -> None:
    server, _ = emulated
    first = read_clock(server.base_url)
    later = wait_for(lambda: (reading := read_clock(server.base_url)).ranks[0]["idle_wall_seconds"]
                     > first.ranks[0]["idle_wall_seconds"] and reading, "idle time to grow")
    assert later.ranks[0]["forwards"] == first.ranks[0]["forwards"]
    assert later.ranks[0]["device_seconds"] == first.ranks[0]["device_seconds"]
    grown = later.ranks[0]["idle_wall_seconds"] - first.ranks[0]["idle_wall_seconds"]
    assert grown <= later.ranks[0]["wall_seconds"] - first.ranks[0]["wall_seconds"]
    assert emulated_seconds(first, later) == pytest.approx(grown)


def test_outputs_follow_max_tokens_as_the_emulated_token(emulated) -> None:
    server, plan = emulated
    token = plan.emulation.token_id
    lengths = [1, 7, 40, 120]
    answers: dict[int, dict[str, Any]] = {}
    threads = [threading.Thread(target=lambda n=n: answers.__setitem__(n, generate(server, list(range(1000, 1100)), n)))
               for n in lengths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for n in lengths:
        assert answers[n]["output_ids"] == [token] * n
        assert answers[n]["meta_info"]["completion_tokens"] == n
        assert answers[n]["text"] == " the" * n


def test_a_shared_prefix_is_priced_as_a_radix_cache_hit(emulated) -> None:
    server, _ = emulated
    prefix = list(range(2000, 2600))
    generate(server, prefix + list(range(3000, 3010)), 4)
    before = read_clock(server.base_url)
    answer = generate(server, prefix + list(range(4000, 4010)), 4)
    after = read_clock(server.base_url)
    cached = answer["meta_info"]["cached_tokens"]
    assert cached >= len(prefix)
    assert prefill_chunks(new_forwards(before, after)) == [(len(prefix) + 10 - cached, cached)]


def test_the_clock_is_exactly_the_sum_of_the_priced_shapes(emulated) -> None:
    server, _ = emulated
    before = read_clock(server.base_url)
    generate(server, list(range(7000, 7300)), 16)
    after = read_clock(server.base_url)
    state = after.ranks[0]
    assert state["recent_dropped"] == 0 and len(state["recent"]) == state["forwards"]
    for record in state["recent"]:
        assert record["seconds"] == STEP.seconds(BatchShape.from_dict(record["shape"]))
    assert state["device_seconds"] == pytest.approx(sum(record["seconds"] for record in state["recent"]), rel=1e-12)
    added = new_forwards(before, after)
    assert [record["kind"] for record in added] == ["prefill"] + ["decode"] * 15
    assert after.ranks[0]["device_seconds"] - before.ranks[0]["device_seconds"] == pytest.approx(
        sum(record["seconds"] for record in added), rel=1e-9)
    by_kind = state["by_kind"]
    assert sum(kind["forwards"] for kind in by_kind.values()) == state["forwards"]
    assert sum(kind["device_seconds"] for kind in by_kind.values()) == pytest.approx(state["device_seconds"])


def test_a_long_prompt_is_chunked_and_mixed_with_running_decodes(emulated) -> None:
    """A decode runs until the long prompt has its answer, then is aborted: with free forwards a
    decode of fixed length could end before the prompt reached the scheduler (400 tokens did on a
    loaded CI host). Its forwards may be more than the clock's window keeps, so this test comes
    after the one that needs every forward since start in it."""
    server, _ = emulated
    long_prompt = [5000 + i % 20000 for i in range(CHUNK + 1808)]
    started = threading.Event()
    rid = "long-decode"

    def decode_long() -> None:
        with requests.post(f"{server.base_url}/generate", stream=True, timeout=600, json={
                "input_ids": list(range(100, 140)), "stream": True, "rid": rid,
                "sampling_params": {"max_new_tokens": 20000, "ignore_eos": True, "temperature": 0}}) as response:
            for _line in response.iter_lines():
                started.set()

    decoder = threading.Thread(target=decode_long)
    decoder.start()
    assert started.wait(600)
    before = read_clock(server.base_url)
    try:
        generate(server, long_prompt, 2)
        after = read_clock(server.base_url)
    finally:
        requests.post(f"{server.base_url}/abort_request", json={"rid": rid}, timeout=60).raise_for_status()
        decoder.join()
    records = new_forwards(before, after, kept_only=True)
    long_chunks = [chunk for chunk in prefill_chunks(records) if chunk[0] > 1000]
    assert len(long_chunks) == 2, long_chunks
    (first, first_prefix), (second, second_prefix) = long_chunks
    assert first_prefix == 0 and second_prefix == first and first + second == len(long_prompt)
    assert first <= CHUNK
    mixed = [record for record in records if record["kind"] == "mixed"]
    assert any(record["shape"]["prefill_tokens"] > 1000 and record["shape"]["decode_reqs"] == 1 for record in mixed)
    assert {record["kind"] for record in records} >= {"decode", "mixed"}


def test_a_logprob_request_is_answered(emulated) -> None:
    server, _ = emulated
    answer = generate(server, list(range(8000, 8020)), 3, return_logprob=True, top_logprobs_num=2)
    assert answer["meta_info"]["completion_tokens"] == 3
    assert len(answer["meta_info"]["output_token_logprobs"]) == 3
