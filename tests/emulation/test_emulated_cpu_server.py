"""``--emulate cpu``: tiny-llama's real forward runs and answers, and every forward is priced with the
``cpu`` profile next to its measured time."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import requests

from sgl_blend.core.cost_model import CostModel, HardwareSpec, ModelSpec
from sgl_blend.core.latency_model import BatchShape
from sgl_blend.emulation.clock_reader import read_clock
from sgl_blend.emulation.launch import emulated_launch
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.sglang_plugin.settings import PluginSettings
from sgl_blend.forward_time.overlap import hardware_overlap
from sgl_blend.forward_time.step_time import StepTime
from tests.conftest import free_port

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    plan = emulated_launch("cpu", "tiny-llama", ["--port", str(free_port())])
    log = Path(tmp_path_factory.mktemp("emulated-cpu")) / "server.log"
    server = start_server(str(plan.model_path), plan.sglang_args, settings=plan.settings_for(PluginSettings()),
                          log_path=log)
    yield server, plan.model_path
    server.stop()


def test_the_real_forward_runs_timed_beside_its_price(cpu_server) -> None:
    server, model_path = cpu_server
    response = requests.post(f"{server.base_url}/generate", timeout=600, json={
        "text": "The quick brown fox jumps over the lazy dog", "sampling_params": {
            "max_new_tokens": 12, "ignore_eos": True, "temperature": 0}})
    response.raise_for_status()
    assert response.json()["meta_info"]["completion_tokens"] == 12
    state = read_clock(server.base_url).ranks[0]
    assert state["real_forward"] is True and state["token_id"] is None
    step = StepTime.of(CostModel(ModelSpec.from_hf_dir(model_path), HardwareSpec.resolve("cpu")),
                       hardware_overlap(HardwareSpec.resolve("cpu")))
    for record in state["recent"]:
        assert record["measured_seconds"] > 0
        assert record["seconds"] == step.seconds(BatchShape.from_dict(record["shape"]))
    for kind in ("prefill", "decode"):
        totals = state["by_kind"][kind]
        assert totals["forwards"] > 0 and totals["measured_seconds"] > 0 and totals["device_seconds"] > 0
