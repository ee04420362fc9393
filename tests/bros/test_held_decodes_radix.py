"""Held decodes and slot takeover with SGLang's radix cache on (tiny-llama, one server for the module).

Bros mode itself runs without the radix cache, but holding decodes is meant for every mode, and
HyGen and Echo run with it: a held request then keeps its lock on the cached prefix, and a takeover
may only take tokens past that prefix. So this module starts a bros-mode server with the radix cache
left on and runs `test_bros_engine`'s scenarios on it: the answers must still be the ones each
prompt gets alone.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings
from tests.bros.test_bros_engine import ENGINE_FLAGS, SLO_S, grew, held_back_then_resumed, lost_slots_then_finished
from tests.bros.test_bros_launch_and_sim import MODEL
from tests.colocation.test_colocation_server import plugin_state
from tests.conftest import free_port

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = ColocationConfig(mode="bros", latency_model=MODEL, ttft_slo_s=SLO_S, tpot_slo_s=SLO_S)
    settings = PluginSettings(offline_policy=OFF, colocation=config)
    args = ["--port", str(free_port()), "--enable-mixed-chunk", *ENGINE_FLAGS]
    process = start_server("tiny-llama", args, log_path=tmp_path_factory.mktemp("bros-radix") / "server.log",
                           settings=settings)
    yield process
    process.stop()


def test_the_radix_cache_is_on(server: ServerProcess) -> None:
    import requests

    assert requests.get(f"{server.base_url}/server_info", timeout=60).json()["disable_radix_cache"] is False
    assert plugin_state(server)["bros"] is not None


def test_a_held_back_decode_keeps_its_cached_prefix_and_completes(server: ServerProcess) -> None:
    alone, answers, before, after = held_back_then_resumed(server, ("radix-held-a", "radix-held-b"))
    assert grew(before, after, "held", "resumes") > 0, after["held"]
    assert [answer["output_ids"] for answer in answers] == alone
    assert after["held"]["held_now"] == 0


def test_a_takeover_leaves_the_cached_prefix_and_the_text_unchanged(server: ServerProcess) -> None:
    alone, interrupted, before, after = lost_slots_then_finished(server, "radix-lost-slots")
    taken = grew(before, after, "checkpoint", "checkpointed_tokens")
    assert taken > 0 and grew(before, after, "checkpoint", "restored_tokens") == taken, after["checkpoint"]
    assert interrupted == alone
