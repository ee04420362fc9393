"""SGLang's frontend language against the server: a `sgl.function` program online and with
`run_batch` through `RuntimeEndpoint`, and the same program as offline work (the example in
`examples/frontend_offline.py`, run as a user would)."""

from __future__ import annotations

import pytest

import json
import subprocess
import sys
from pathlib import Path

import sglang as sgl
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

from sgl_blend.launch.supervisor import ServerProcess
from tests.batch.conftest import API_KEY

pytestmark = pytest.mark.server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "frontend_offline.py"


@sgl.function
def answer(s, question: str) -> None:
    s += "Question: " + question + "\nAnswer:"
    s += sgl.gen("answer", max_tokens=6, temperature=0)


def test_program_online_and_run_batch(batch_server: ServerProcess) -> None:
    backend = RuntimeEndpoint(batch_server.base_url, api_key=API_KEY)
    single = answer.run(question="What is a prefix tree?", backend=backend)
    assert single["answer"] and single.get_meta_info("answer")["completion_tokens"] == 6
    states = answer.run_batch([{"question": f"Question number {index}?"} for index in range(6)], backend=backend,
                              num_threads=6)
    assert len(states) == 6 and all(state["answer"] for state in states)


def test_example_sends_the_program_as_offline_work(batch_server: ServerProcess) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--url", batch_server.base_url, "--api-key", API_KEY,
                           "--n", "8"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["online_answer"] and len(result["offline_answers"]) == 8 and all(result["offline_answers"])
    assert result["offline_requests_seen"] >= 8
