"""BROS inside the engine (tiny-llama, one server for the module): best-effort (BE) decodes held
back with their KV resident, real-time (RT) requests taking BE slots that are checkpointed to host
and restored, and a held request aborted by its client.

The server's KV pool is 1024 tokens, so an RT prompt of 900 tokens cannot be admitted next to a BE
request that holds 200 without taking some of its slots, and it runs at most 3 requests at once,
so Alg. 1's batch (capped by the engine's request limit) leaves one of two BE decodes out while
two RT requests are in the system. The SLOs are 1 ms, so every RT request is always past its
deadline and Alg. 1 never lets a BE request replace one (it only replaces an RT request that would
still meet its deadline next iteration): the cap alone decides who is left out. Every BE answer is compared, token for token, with the answer
the same prompt gets alone on the same server (temperature 0, ignore_eos). The scenarios are
functions of the server so the radix-cache module runs them on its own server.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Iterator

import pytest
import requests

from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.launch.colocation import colocation_launch
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings
from tests.bros.test_bros_launch_and_sim import MODEL
from tests.colocation.test_colocation_server import RESET, generate, generate_streaming, plugin_state, set_state, tokens
from tests.conftest import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.server

SLO_S = 1e-3
KV_TOKENS = 1024
MAX_RUNNING = 3
# The BE request must still be decoding when the RT prompt is admitted: it has decoded 100 tokens
# when the RT request is sent, and 700 more outlast the RT request's HTTP and tokenizer path on a
# loaded 2-core host (at 400 the BE request once finished first and no slot was taken).
TAKEOVER_BE_TOKENS = 800
ENGINE_FLAGS = ("--max-total-tokens", str(KV_TOKENS), "--max-running-requests", str(MAX_RUNNING))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = ColocationConfig(mode="bros", latency_model=MODEL, ttft_slo_s=SLO_S, tpot_slo_s=SLO_S)
    settings = PluginSettings(offline_policy=OFF, colocation=config)
    args = colocation_launch(settings, ["--port", str(free_port()), *ENGINE_FLAGS])
    process = start_server("tiny-llama", args, log_path=tmp_path_factory.mktemp("bros-engine") / "server.log",
                           settings=settings)
    yield process
    process.stop()


def bros(server: ServerProcess) -> dict[str, Any]:
    """BROS's state; it must still be scheduling (a part switched off leaves SGLang's own)."""
    state = plugin_state(server)
    assert state["switched_off"] == [], state["switched_off"]
    return state["bros"]


def grew(before: dict[str, Any], after: dict[str, Any], section: str, name: str) -> int:
    return after[section][name] - before[section][name]


def lost_slots_then_finished(server: ServerProcess, rid: str) -> tuple[list[int], list[int], dict, dict]:
    """A BE request decodes alone; once it has 100 tokens an RT request with a 900-token prompt
    arrives. Returns the BE answer alone, the BE answer interrupted, and the state before/after."""
    prompt = tokens(100, 7)
    alone = generate(server, prompt, TAKEOVER_BE_TOKENS, offline=True)["output_ids"]
    before = bros(server)
    progress = [0]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        best_effort = pool.submit(generate_streaming, server, prompt, TAKEOVER_BE_TOKENS, rid, progress)
        wait_for(lambda: progress[0] >= 100 or best_effort.done(), "the BE request to decode 100 tokens")
        realtime = generate(server, tokens(900, 8), 8, offline=False)
        interrupted = best_effort.result()["output_ids"]
    assert len(realtime["output_ids"]) == 8
    return alone, interrupted, before, bros(server)


def held_back_then_resumed(server: ServerProcess, rids: tuple[str, str]) -> tuple[list[list[int]], list[dict], dict, dict]:
    """Two BE requests decode; two RT requests arrive together, and the batch cap leaves one BE
    decode out until they are done. Returns each BE answer alone and interrupted, and the states."""
    prompts = [tokens(100, 20 + index) for index in range(2)]
    alone = [generate(server, prompt, 300, offline=True)["output_ids"] for prompt in prompts]
    before = bros(server)
    progress = [[0], [0]]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        best_effort = [pool.submit(generate_streaming, server, prompt, 300, rid, count)
                       for prompt, rid, count in zip(prompts, rids, progress)]
        wait_for(lambda: all(count[0] >= 20 for count in progress), "both BE requests decoding")
        realtime = [pool.submit(generate, server, tokens(40, 30 + index), 64, offline=False) for index in range(2)]
        assert all(len(future.result()["output_ids"]) == 64 for future in realtime)
        answers = [future.result() for future in best_effort]
    return alone, answers, before, bros(server)


def test_a_best_effort_request_that_lost_slots_finishes_with_its_uninterrupted_text(server: ServerProcess) -> None:
    alone, interrupted, before, after = lost_slots_then_finished(server, "lost-slots")
    taken = grew(before, after, "checkpoint", "checkpointed_tokens")
    assert taken > 0, after["checkpoint"]
    assert grew(before, after, "checkpoint", "restored_tokens") == taken, after["checkpoint"]
    assert grew(before, after, "takeover", "admission_takeovers") > 0, after["takeover"]
    assert interrupted == alone
    assert after["checkpoint"]["host_tokens"] == 0 and after["held"]["held_now"] == 0
    assert after["kv_free"] == after["kv_total"], "every slot is back in the pool"


def test_a_held_back_best_effort_decode_resumes_and_completes(server: ServerProcess) -> None:
    alone, answers, before, after = held_back_then_resumed(server, ("held-a", "held-b"))
    assert grew(before, after, "takeover", "held_by_plan") > 0, after["takeover"]
    assert grew(before, after, "held", "resumes") > 0, after["held"]
    assert [answer["output_ids"] for answer in answers] == alone
    assert after["held"]["held_now"] == 0 and after["kv_free"] == after["kv_total"]


def test_a_held_request_aborted_by_its_client_is_freed(server: ServerProcess) -> None:
    before = bros(server)
    progress = [[0], [0]]
    rids = ("abort-a", "abort-b")
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        best_effort = [pool.submit(generate_streaming, server, tokens(100, 40 + index), 300, rid, count)
                       for index, (rid, count) in enumerate(zip(rids, progress))]
        wait_for(lambda: all(count[0] >= 20 for count in progress), "both BE requests decoding")
        realtime = [pool.submit(generate, server, tokens(40, 50 + index), 200, offline=False) for index in range(2)]
        held = wait_for(lambda: bros(server)["held"]["held_rids"], "a BE decode held back")
        # The held request goes first: aborting the running one frees its slot, and the held one
        # would resume before its own abort arrived (CI saw exactly that once).
        for rid in sorted(rids, key=lambda rid: rid not in held):
            requests.post(f"{server.base_url}/abort_request", json={"rid": rid}, timeout=60).raise_for_status()
        endings = [future.result()["meta_info"]["finish_reason"]["type"] for future in best_effort]
        assert all(len(future.result()["output_ids"]) == 200 for future in realtime)
    after = bros(server)
    assert endings == ["abort", "abort"]
    assert grew(before, after, "held", "aborted") > 0, after["held"]
    assert after["held"]["held_now"] == 0 and after["kv_free"] == after["kv_total"], "the held KV went back"


def test_a_long_best_effort_prompt_is_prefilled_in_chunks_sized_to_the_idle_cap(server: ServerProcess) -> None:
    """With no RT request present a 10 ms idle cap bounds the iteration: the fitted model prices a
    prefill at 5 ms plus 20 µs a token, so a 600-token BE prompt is computed in forwards of at most
    250 tokens, each on the prefix the one before computed, instead of in one 17 ms forward."""
    prompt = tokens(600, 60)
    before = bros(server)
    assert set_state(server, {"sgl_blend_idle_budget_s": 0.010, RESET: 1})
    try:
        answer = generate(server, prompt, 4, offline=True)
    finally:
        assert set_state(server, {"sgl_blend_idle_budget_s": 1e6})
    assert len(answer["output_ids"]) == 4
    records = plugin_state(server)["iterations"]
    chunks = [tuple(chunk) for record in records if record["offline_prefill"] for chunk in record["prefill_chunks"]]
    assert len(chunks) >= 3 and all(extend <= 250 for extend, _ in chunks), chunks
    assert [prefix for _, prefix in chunks] == [sum(extend for extend, _ in chunks[:i]) for i in range(len(chunks))]
    assert sum(extend for extend, _ in chunks) == len(prompt)
    # Admitted truncated once; SGLang carried the rest as its chunked request, sized by later plans.
    assert grew(before, bros(server), "takeover", "chunked_by_plan") == 1
