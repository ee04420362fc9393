"""The SGLang flags a configuration runs with come from its `PluginSettings` alone, and `sgl-blend
serve` runs with them: mixed prefill/decode batches wherever offline work is ordered, SGLang's own
schedule policy for the names the registry gives it, the annotated radix cache where the plan
blends or a co-location mode needs it."""

from __future__ import annotations

import os
import re
import signal

import pytest

from sgl_blend.cli import main
from sgl_blend.client import http
from sgl_blend.core.colocation import ColocationConfig
from sgl_blend.core.policy_registry import REGISTRY, SERVE, names_for
from sgl_blend.sglang_plugin.settings import OFF, PluginSettings
from tests.bros.test_bros_launch_and_sim import MODEL as BROS_MODEL
from tests.conftest import free_port
from tests.waiting import wait_for


def flags_of(**settings: object) -> dict[str, str | None]:
    return dict(PluginSettings(**settings).sglang_flags())


def test_every_ordering_policy_runs_with_mixed_batches_and_its_sglang_order() -> None:
    for name in names_for(SERVE):
        flags = flags_of(offline_policy=name)
        if name == OFF:
            assert flags == {}
            continue
        assert "--enable-mixed-chunk" in flags, name
        assert flags["--schedule-policy"] == REGISTRY[name].sglang_schedule, name


def test_the_cache_flags_follow_blending_and_colocation() -> None:
    assert "--radix-cache-backend" not in flags_of(offline_policy="blendserve", hardware="cpu")
    blending = flags_of(offline_policy="blendserve", hardware="a100-80g")
    assert (blending["--radix-cache-backend"], blending["--radix-eviction-policy"]) == ("sgl-blend", "priority")
    assert "--radix-cache-backend" not in flags_of(offline_policy="dfs", hardware="a100-80g")
    bros = flags_of(offline_policy=OFF, colocation=ColocationConfig(mode="bros", latency_model=BROS_MODEL))
    assert bros == {"--enable-mixed-chunk": None, "--disable-radix-cache": None}


@pytest.mark.server
@pytest.mark.server
def test_serve_runs_with_mixed_chunk_on(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    assert main(["serve", "--model", "tiny-llama", "--port", str(port), "--detach", "--no-batch-api"]) == 0
    pid = int(re.search(r"\(pid (\d+)\)", capsys.readouterr().out).group(1))
    try:
        info = http.server_info(f"http://127.0.0.1:{port}")
        assert info["enable_mixed_chunk"] is True and info["schedule_policy"] == "fcfs"
    finally:  # the detached server is this process's child: stop its group and reap it
        os.killpg(pid, signal.SIGTERM)
        wait_for(lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, "the detached server to stop")
