"""`--colocation bros` in a real SGLang scheduler (tiny-llama, one server for the module).

Online (RT) and offline (BE) requests run at once; every answer must be the one the same prompt
gets on its own at temperature 0, Alg. 1 must have planned the iterations, the BROS metrics
must count what was served, and the radix cache must be off as the mode promises (`/server_info`
says the scheduler runs the bros mode; a repeated prompt finds nothing cached).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Iterator

import pytest
import requests

from sgl_blend.launch.colocation import colocation_launch
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings
from tests.bros.test_bros_launch_and_sim import MODEL
from tests.colocation.test_colocation_server import generate, plugin_state, tokens
from tests.conftest import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    settings = PluginSettings(offline_policy=OFF, colocation=ColocationConfig(mode="bros", latency_model=MODEL))
    args = colocation_launch(settings, ["--port", str(free_port()), "--max-total-tokens", "4096"])
    log = tmp_path_factory.mktemp("bros") / "server.log"
    process = start_server("tiny-llama", args, log_path=log, settings=settings)
    yield process
    process.stop()


def test_realtime_and_best_effort_requests_answer_correctly_while_both_run(server: ServerProcess) -> None:
    be_prompts = [tokens(300, seed) for seed in range(6)]
    rt_prompts = [tokens(40, 100 + seed) for seed in range(4)]
    reference_be = generate(server, be_prompts[0], 32, offline=True)["output_ids"]
    reference_rt = generate(server, rt_prompts[0], 16, offline=False)["output_ids"]
    before = plugin_state(server)["bros"]["metrics"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        best_effort = [pool.submit(generate, server, be_prompts[0], 32, offline=True)]
        best_effort += [pool.submit(generate, server, prompt, 32, offline=True) for prompt in be_prompts[1:]]
        realtime = [pool.submit(generate, server, rt_prompts[0], 16, offline=False)]
        realtime += [pool.submit(generate, server, prompt, 16, offline=False) for prompt in rt_prompts[1:]]
        be_results = [future.result() for future in best_effort]
        rt_results = [future.result() for future in realtime]
    assert be_results[0]["output_ids"] == reference_be
    assert rt_results[0]["output_ids"] == reference_rt
    assert all(len(result["output_ids"]) == 32 for result in be_results)
    assert all(len(result["output_ids"]) == 16 for result in rt_results)
    state: dict[str, Any] = plugin_state(server)["bros"]
    assert state["plans"] > 0 and state["last_plan"]["batch_size"] >= 1
    metrics = state["metrics"]
    assert metrics["rt_finished"] - before["rt_finished"] == 4
    assert metrics["be_finished"] - before["be_finished"] == 6
    assert metrics["ttft_attainment"] is not None and metrics["tpot_attainment_per_token"] is not None
    assert metrics["normalized_latency_s"] > 0 and metrics["be_requests_per_s"] > 0


def test_prompts_the_plan_admits_run_while_it_leaves_others_waiting(server: ServerProcess) -> None:
    """Four RT requests decode 500 tokens each while eight BE prompts of 900 tokens arrive: the
    4,096-token pool holds two of them beside the RT requests, so every plan admits some waiting
    prompts and leaves the rest out. SGLang's adder stops at the first waiting request the plan
    leaves out, so the queue must be in the plan's order: then BE requests finish while the RT
    ones still decode (out of order, one did and the rest waited for the RT requests to finish).
    Half of them is the bar: the RT requests take about seven times as long as all eight."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        realtime = [pool.submit(generate, server, tokens(40, 200 + seed), 500, offline=False) for seed in range(4)]
        wait_for(lambda: plugin_state(server)["bros"]["last_plan"]["realtime"] >= 4, "the four RT requests to run",
                 poll_s=0.05)
        best_effort = [pool.submit(generate, server, tokens(900, 300 + seed), 4, offline=True) for seed in range(8)]
        finished = [future in best_effort for future in concurrent.futures.as_completed([*realtime, *best_effort])]
        assert finished.index(False) >= 4, f"BE requests finished before the first RT one: {finished.index(False)}"
        assert all(len(future.result()["output_ids"]) == 4 for future in best_effort)
        assert all(len(future.result()["output_ids"]) == 500 for future in realtime)


def test_bros_mode_runs_without_the_radix_cache(server: ServerProcess) -> None:
    info = requests.get(f"{server.base_url}/server_info", timeout=60).json()
    assert info["disable_radix_cache"] is True
    state = info["internal_states"][0]["sgl_blend"]
    assert state["bros"] is not None and state["colocation"] is None, "the scheduler runs the bros mode"
    prompt = tokens(200, 77)
    generate(server, prompt, 4, offline=False)
    again = generate(server, prompt, 4, offline=False)
    assert again["meta_info"]["cached_tokens"] == 0, "a repeated prompt finds nothing cached"
