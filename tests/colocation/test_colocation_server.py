"""Co-location in a real SGLang scheduler (tiny-llama, KV pool of 4096 tokens so offline work can
fill it; one HyGen server, then one Echo server): online requests are admitted in the very next
iteration even when offline work saturates the engine, a preempted offline request resumes from
its cached KV and writes exactly what an undisturbed run writes, settings change at runtime, a
batch waits in the engine's queue only as much as the window of a co-locating engine lets it, and
Echo's selector decides which offline requests the engine admits."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import random
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import openai
import pytest
import requests

from sgl_blend.launch.colocation import colocation_launch
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.offline import offline_routing_key
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.server.window import QUEUE_FLOOR, QUEUE_LOOK_S
from sgl_blend.sglang_plugin.settings import PluginSettings
from tests.batch.helpers import chat_lines, create_batch, wait_until
from tests.conftest import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.server

KV_TOKENS = 4096
ECHO_CHUNK = 2048
VOCAB = 1024
RESET = "sgl_blend_reset_records"
# A stand-in latency model (1 ms + 10 µs per prefill token): this module checks mechanics, not timing.
MODEL = {"form": "hygen", "coefficients": {"intercept": 1e-3, "S_p": 1e-5, "S_d": 0.0, "S_p^2": 0.0, "S_d^2": 0.0,
                                            "N_p": 0.0, "N_d": 0.0}}


def launch(tmp_path_factory: pytest.TempPathFactory, config: ColocationConfig, *flags: str,
           batch_api: bool = False) -> ServerProcess:
    settings = PluginSettings(offline_policy="fcfs", colocation=config)
    args = colocation_launch(settings, ["--port", str(free_port()), "--max-total-tokens", str(KV_TOKENS), *flags])
    work = tmp_path_factory.mktemp("colocation")
    return start_server("tiny-llama", args, log_path=work / "server.log", settings=settings,
                        batch_api=BatchApiConfig(data_dir=work / "batches") if batch_api else None)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = launch(tmp_path_factory, ColocationConfig(mode="hygen", latency_model=MODEL), batch_api=True)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Echo mode with deadlines this CPU meets without trouble, and two request slots, so requests
    wait for a slot together and the selector's choice among them shows in who gets it; a prefill
    chunk smaller than the pool, so a prompt can take two."""
    process = launch(tmp_path_factory, ColocationConfig(mode="echo", ttft_slo_s=30.0, tpot_slo_s=5.0,
                                                        latency_model=MODEL), "--max-running-requests", "2",
                     "--chunked-prefill-size", str(ECHO_CHUNK))
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
                       progress: list[int], *, offline: bool = True) -> dict[str, Any]:
    """A `generate` that streams, so the test sees how many tokens it has decoded so far
    (``progress[0]``, from each chunk's ``completion_tokens``); the last chunk (cumulative output)."""
    body: dict[str, Any] = {"input_ids": input_ids, "return_output_ids": True, "stream": True, "rid": rid,
                            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
    if offline:
        body["routing_key"] = offline_routing_key("test")
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
    wait; each online request (300 + 8 tokens) finds no room and must take it from offline work.
    The admission records when the scheduler received each: between the client's send and its answer."""
    assert set_state(server, {RESET: 1})
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        offline = [pool.submit(generate, server, tokens(400, seed), 100, offline=True) for seed in range(12)]
        wait_for(lambda: (plugin_state(server)["offline"] or {}).get("running", 0) >= 6, "six offline requests running")
        online_ids, spans = [], {}
        for index in range(3):
            sent = time.time()
            answer = generate(server, tokens(300, 1000 + index), 8, offline=False)
            online_ids.append(answer["meta_info"]["id"])
            spans[answer["meta_info"]["id"]] = (sent, time.time())
            assert len(answer["output_ids"]) == 8
        state = plugin_state(server)
        assert all(future.result()["meta_info"]["completion_tokens"] == 100 for future in offline)
    admissions = {entry["rid"]: entry for entry in state["online_admissions"]}
    assert set(online_ids) <= set(admissions), state["online_admissions"]
    late = [admissions[rid] for rid in online_ids if admissions[rid]["scheduled_in"] != admissions[rid]["arrived_after"] + 1]
    assert not late, late
    received = [(spans[rid][0], admissions[rid]["received"], spans[rid][1]) for rid in online_ids]
    assert all(sent <= at <= answered for sent, at, answered in received), received
    counts = state["colocation"]["counts"]
    # taken by the plan's offline memory budget (HyGen Alg. 2), or by the adder when that falls short
    assert counts.get("preempted_for_memory", 0) + counts.get("memory_reclaimed", 0) > 0, counts
    busy = {record["iteration"]: record for record in state["iterations"]}
    admitting = busy[admissions[online_ids[0]]["scheduled_in"]]
    assert round(admissions[online_ids[0]]["received"], 4) in admitting["online_received"], admitting
    # one chunk holds its prompt: the batch that admits it makes its first token
    assert round(admissions[online_ids[0]]["received"], 4) in admitting["online_prefilled"], admitting
    first_arrival = busy[admissions[online_ids[0]]["arrived_after"]]
    assert first_arrival["offline_decode"] + first_arrival["offline_prefill"] >= 6, first_arrival


def test_preempted_offline_request_resumes_from_its_cache_with_identical_output(server: ServerProcess) -> None:
    """An offline request that has decoded ``decoded`` tokens when a 3400-token online request needs
    its KV is retracted, resumes from the cached prompt and those tokens, and writes what it
    writes undisturbed."""
    prompt, decoded = tokens(300, 7), 100
    # 1,500 tokens: at 600 a fast host finished the offline request before the online one arrived.
    undisturbed = generate(server, prompt, 1500, offline=True, rid="undisturbed")
    requests.post(f"{server.base_url}/flush_cache", timeout=60).raise_for_status()
    progress = [0]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        interrupted = pool.submit(generate_streaming, server, prompt, 1500, "interrupted", progress)
        wait_for(lambda: progress[0] >= decoded or interrupted.done(), f"the offline request to decode {decoded} tokens")
        online = generate(server, tokens(3400, 8), 8, offline=False)
        resumed = interrupted.result()
    assert len(online["output_ids"]) == 8
    assert resumed["output_ids"] == undisturbed["output_ids"]
    assert resumed["meta_info"]["num_retractions"] >= 1
    resumes = [entry for entry in plugin_state(server)["colocation"]["resumes"] if entry["rid"] == "interrupted"]
    assert resumes and all(entry["resumed_prefix"] > 0 for entry in resumes), resumes
    assert resumes[0]["resumed_prefix"] >= len(prompt) + decoded, resumes  # the decoded tokens' KV was kept too


@contextlib.contextmanager
def online_decoding(server: ServerProcess, max_new_tokens: int) -> Iterator[None]:
    """An online request decoding throughout the block, so every iteration has online work in it
    and a zero latency budget holds offline work (an iteration with nothing in it takes one offline
    unit whatever the budget). It must still be decoding when the block ends, then it is aborted."""
    progress = [0]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        present = pool.submit(generate_streaming, server, tokens(8, 77), max_new_tokens, "online-present", progress,
                              offline=False)
        wait_for(lambda: progress[0] > 0 or present.done(), "the online request to decode")
        try:
            yield
            assert not present.done(), f"the online request ended within the block ({progress[0]} tokens); give it more"
        finally:
            requests.post(f"{server.base_url}/abort_request", json={"rid": "online-present"}, timeout=60)
            present.result()


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


def test_offline_work_runs_under_a_budget_below_any_iteration_when_nothing_online_is_there(
        server: ServerProcess) -> None:
    """A zero budget with no online request: each iteration takes one offline unit -- a prompt
    chunk of at most `min_offline_chunk` tokens, then the decode -- and the request completes. (A
    budget that priced even these out stopped the emulated HyGen batch until an online request came.)"""
    assert set_state(server, {"sgl_blend_latency_budget_s": 0.0, RESET: 1})
    try:
        answer = generate(server, tokens(40, 12), 6, offline=True)
        records = plugin_state(server)["iterations"]
    finally:
        assert set_state(server, {"sgl_blend_clear_latency_budget": 1})
    assert answer["meta_info"]["completion_tokens"] == 6
    chunk = ColocationConfig().min_offline_chunk
    prefills = [record["prefill_tokens"] for record in records if record["offline_prefill"]]
    assert prefills == [chunk, chunk, 40 - 2 * chunk], prefills
    assert all(record["prefill_reqs"] + record["decode_reqs"] == 1 for record in records), records


def test_a_decode_iteration_is_planned_once(server: ServerProcess) -> None:
    """SGLang passes through its prefill step on every iteration, building nothing while only
    decodes run, then decodes. The prefill pass's plan stands for that decode: planning again
    doubled the mode's scheduler time on every decode iteration (HyGen's scheduler took 0.78 of the
    emulated H100 bench's 2 cores where priority's took 0.47). Two snapshots while two offline
    requests decode: one plan per iteration between them."""
    assert set_state(server, {RESET: 1})

    def looked() -> tuple[int, int, int]:
        state = plugin_state(server)
        last = max((record["iteration"] for record in state["iterations"]), default=0)
        return state["colocation"]["counts"].get("plans", 0), last, (state["offline"] or {}).get("running", 0)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        decoding = [pool.submit(generate, server, tokens(32, 40 + seed), 600, offline=True) for seed in range(2)]
        wait_for(lambda: looked()[2] == 2, "both offline requests running")
        plans_before, iteration_before, _ = looked()
        # Counted in iterations, not seconds: a loaded CI host ran 7 in half a second.
        wait_for(lambda: looked()[1] >= iteration_before + 20 or looked()[2] < 2, "20 more decode iterations")
        plans_after, iteration_after, running = looked()
        assert all(future.result()["meta_info"]["completion_tokens"] == 600 for future in decoding)
    assert running == 2, "the requests finished before the second look; make them longer"
    iterations = iteration_after - iteration_before
    assert plans_after - plans_before <= iterations + 1, (plans_after - plans_before, iterations)


def engine_load(server: ServerProcess) -> dict[str, Any]:
    """The first scheduler's load report, as `/v1/loads` gives it."""
    return requests.get(f"{server.base_url}/v1/loads?include=core", timeout=60).json()["loads"][0]


def waiting_in_engine(server: ServerProcess) -> int:
    return engine_load(server)["num_waiting_reqs"]


def test_a_batch_waits_in_a_colocating_engine_only_as_far_as_its_window(server: ServerProcess) -> None:
    """While an online request decodes under a latency budget below any iteration, HyGen admits no
    offline line: the batch's lines can only wait. The full window (twice the ~190 short lines the
    4,096-token pool holds) would put all 150 in SGLang's queue; a co-locating engine's window holds
    `QUEUE_FLOOR` there, and one more for the online decode the engine reports running (a line on
    its way to the scheduler counts as running only as far as the engine runs something). When
    lines on their way counted as running, a tokenizer that lagged the scheduler doubled the window
    at every look (64 here, 128 on a loaded CI host). Once the budget is lifted the batch completes."""
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    with online_decoding(server, 3500):
        assert set_state(server, {"sgl_blend_latency_budget_s": 1e-4})
        try:
            batch = create_batch(client, chat_lines(150, "queued"))
            wait_for(lambda: waiting_in_engine(server) >= QUEUE_FLOOR, "the batch's lines to wait in the engine")
            seen = []
            for _ in range(6):
                time.sleep(QUEUE_LOOK_S)
                seen.append(waiting_in_engine(server))
            assert QUEUE_FLOOR <= min(seen) and max(seen) <= QUEUE_FLOOR + 1, seen
            assert client.batches.retrieve(batch.id).request_counts.completed == 0
        finally:
            assert set_state(server, {"sgl_blend_clear_latency_budget": 1})
    done = wait_until(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 150, done


def test_the_load_report_counts_the_decodes_a_mixed_iteration_runs(server: ServerProcess) -> None:
    """Two offline requests decode while online prompts keep arriving, so many iterations are mixed:
    SGLang folds the decodes into the prefill batch and leaves an empty running batch until the
    result is back, and its own report said 0 running from there. The runner sizes a co-locating
    engine's window from the report (`colocated_window`), so every look must count both decodes.
    The report is read until ten mixed iterations have run beside it (how many a second holds
    depends on the host), the iterations told apart by number across reads of the kept records."""
    stop = threading.Event()

    def online(seed: int) -> int:
        sent = 0
        while not stop.is_set():
            generate(server, tokens(200, 5000 + 1000 * seed + sent), 1, offline=False)
            sent += 1
        return sent

    seen: list[int] = []
    mixed: set[int] = set()

    def ten_mixed_iterations_read_beside() -> bool:
        for _ in range(10):
            seen.append(engine_load(server)["num_running_reqs"])
            time.sleep(0.05)
        mixed.update(record["iteration"] for record in plugin_state(server)["iterations"]
                     if record["mode"] == "mixed" and record["offline_decode"] == 2)
        return len(mixed) >= 10 or any(future.done() for future in decoding)

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        decoding = [pool.submit(generate, server, tokens(32, 60 + seed), 1500, offline=True, rid=f"reported-{seed}")
                    for seed in range(2)]
        wait_for(lambda: (plugin_state(server)["offline"] or {}).get("running", 0) == 2, "both offline requests running")
        arrivals = [pool.submit(online, seed) for seed in range(3)]
        wait_for(lambda: all(arrival.running() for arrival in arrivals), "online requests arriving")
        assert set_state(server, {RESET: 1})
        wait_for(ten_mixed_iterations_read_beside, "ten mixed iterations decoding both offline requests", poll_s=0)
        still_decoding = not any(future.done() for future in decoding)
        stop.set()
        for seed in range(2):
            requests.post(f"{server.base_url}/abort_request", json={"rid": f"reported-{seed}"}, timeout=60)
        assert all(arrival.result() > 0 for arrival in arrivals)
        for future in decoding:
            future.result()
    assert still_decoding, "the offline requests finished while the report was read; make them longer"
    assert min(seen) >= 2, seen


def test_a_parked_offline_decode_is_held_with_its_kv_through_an_online_burst_and_resumes_without_a_prefill(
        server: ServerProcess) -> None:
    """Beside an online decode, a zero latency budget parks the offline decode (HyGen's decode
    skipping): it leaves the batch with its KV resident. More online requests then insert more
    distinct prompts than the pool has free; the held KV is not the cache's to evict. Once the
    budget is lifted the decode goes back into the batch as it was: no forward from the park until
    it has decoded 20 more tokens prefills a single offline token (a retracted decode would come
    back through a prefill), and what it wrote before the online request joined is what it writes
    alone. (Past that point the tokens are not compared: SGLang's CPU kernels are not made
    batch-invariant, so beside another request a random model's near-tied logits may pick another
    token; one CI run differed at token 96 after the hold's checks before it had passed. Its 1,000
    tokens outlast the moment the budget takes effect on a fast host; those 20 tokens keep the
    forwards counted within the iteration log's 256 records.)"""
    prompt = tokens(300, 21)
    undisturbed = generate(server, prompt, 1000, offline=True, rid="held-undisturbed")
    requests.post(f"{server.base_url}/flush_cache", timeout=60).raise_for_status()
    progress = [0]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        parked = pool.submit(generate_streaming, server, prompt, 1000, "held", progress)
        wait_for(lambda: progress[0] >= 50, "the offline request to decode 50 tokens")
        alone = progress[0]
        with online_decoding(server, 1500):
            try:
                assert set_state(server, {"sgl_blend_latency_budget_s": 0.0, RESET: 1})
                wait_for(lambda: plugin_state(server)["colocation"]["held"]["held_now"] == 1,
                         "the offline decode held")
                held = plugin_state(server)["colocation"]["held"]
                for index in range(6):
                    assert len(generate(server, tokens(700, 2000 + index), 4, offline=False)["output_ids"]) == 4
                state = plugin_state(server)["colocation"]
                assert state["held"]["held_now"] == 1 and state["held"]["held_tokens"] == held["held_tokens"], (held, state["held"], state["counts"])
                held_at = progress[0]
            finally:
                set_state(server, {"sgl_blend_clear_latency_budget": 1})
        wait_for(lambda: progress[0] >= held_at + 20 or parked.done(), "the held decode to decode 20 more tokens")
        state = plugin_state(server)
        resumed = parked.result()
    assert len(resumed["output_ids"]) == len(undisturbed["output_ids"])
    assert resumed["output_ids"][:alone] == undisturbed["output_ids"][:alone]
    assert state["colocation"]["held"]["resumes"] > held["resumes"], state["colocation"]["held"]
    offline_prefills = [record for record in state["iterations"] if record["offline_prefill"]]
    assert not offline_prefills, offline_prefills
    assert any(record["offline_decode"] for record in state["iterations"])


def test_echo_gives_a_free_slot_to_the_request_on_a_resident_prefix(echo_server: ServerProcess) -> None:
    """Two long offline requests hold both slots. "cold" (700 new tokens) then "warm" (40 new
    tokens on a 600-token prefix a finished request left in the cache) wait; FCFS proposes "cold"
    first. When a slot frees, Echo's selector gives it to "warm" (640 tokens for the time of 40), and
    "cold" gets the next one."""
    prefix = tokens(600, 31)
    generate(echo_server, prefix, 4, offline=True, rid="prefix-owner")
    assert set_state(echo_server, {RESET: 1})

    def waiting() -> int:
        loads = requests.get(f"{echo_server.base_url}/v1/loads", params={"include": "core"}, timeout=60).json()
        return loads["loads"][0]["num_waiting_reqs"]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # Long enough to outlast the two waits below on a loaded 2-core host (200 and 400 tokens
        # did not, once); the second ends within the iteration log's 256 records of the first.
        long = [pool.submit(generate, echo_server, tokens(100, 40 + index), 600 + 200 * index, offline=True,
                            rid=f"long-{index}") for index in range(2)]
        wait_for(lambda: (plugin_state(echo_server)["offline"] or {}).get("running", 0) == 2, "both slots taken")
        cold = pool.submit(generate, echo_server, tokens(700, 33), 4, offline=True, rid="cold")
        wait_for(lambda: waiting() == 1, "cold to wait")
        warm = pool.submit(generate, echo_server, prefix + tokens(40, 34), 4, offline=True, rid="warm")
        wait_for(lambda: waiting() == 2, "warm to wait behind cold")
        assert not any(future.done() for future in long)
        answers = [future.result() for future in (cold, warm, *long)]
    assert [len(answer["output_ids"]) for answer in answers] == [4, 4, 600, 800]
    assert answers[1]["meta_info"]["cached_tokens"] >= len(prefix)
    state = plugin_state(echo_server)
    admitted = {entry[1]: entry[0] for entry in state["offline"]["admissions"]}
    assert admitted["warm"] < admitted["cold"], state["offline"]["admissions"]
    chosen = [record["echo"] for record in state["iterations"]
              if record.get("echo", {}).get("adjustments", {}).get("add_prefill")]
    assert any(choice["benefit"] >= 640 for choice in chosen), chosen


def test_echo_decisions_reach_the_engine_with_online_requests(echo_server: ServerProcess) -> None:
    """Eight offline requests (1000 + 200 tokens) keep both slots busy; each online request
    (300 + 8 tokens) takes a slot from offline work, whose decode is parked with its KV and comes
    back through the selector as a one-token prefill. Every request completes, and the counters show
    the selector's decisions carried out: decodes kept, prefills admitted, parked work resumed."""
    assert set_state(echo_server, {RESET: 1})
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        offline = [pool.submit(generate, echo_server, tokens(1000, 100 + seed), 200, offline=True)
                   for seed in range(8)]
        wait_for(lambda: (plugin_state(echo_server)["offline"] or {}).get("running", 0) == 2, "both slots taken")
        online = [generate(echo_server, tokens(300, 1100 + index), 8, offline=False) for index in range(3)]
        assert all(future.result()["meta_info"]["completion_tokens"] == 200 for future in offline)
    assert [len(answer["output_ids"]) for answer in online] == [8, 8, 8]
    counts = plugin_state(echo_server)["colocation"]["counts"]
    assert counts.get("slots_reclaimed", 0) > 0, counts
    assert counts.get("echo_keep_decode", 0) > 0 and counts.get("echo_add_prefill", 0) >= 8, counts
    assert counts.get("echo_add_resume", 0) > 0, counts


def test_a_prompt_prefilled_in_chunks_has_its_first_token_in_its_last_chunks_batch(echo_server: ServerProcess) -> None:
    """A 3,000-token online prompt on an idle engine whose chunk is 2,048 tokens: one batch admits
    it, a later one completes it, and the iteration log records the receipt in both, so a client's
    time to first token splits at the batch that made the token."""
    assert set_state(echo_server, {RESET: 1})
    answer = generate(echo_server, tokens(3000, 51), 4, offline=False)
    state = plugin_state(echo_server)
    (admission,) = [entry for entry in state["online_admissions"] if entry["rid"] == answer["meta_info"]["id"]]
    received = round(admission["received"], 4)
    (admitting,) = [record for record in state["iterations"] if received in record.get("online_received", ())]
    (prefilled,) = [record for record in state["iterations"] if received in record.get("online_prefilled", ())]
    assert admitting["prefill_tokens"] <= ECHO_CHUNK < 3000 and prefilled["iteration"] > admitting["iteration"]
    between = range(admitting["iteration"], prefilled["iteration"] + 1)
    assert sum(record["prefill_tokens"] for record in state["iterations"] if record["iteration"] in between) == 3000
