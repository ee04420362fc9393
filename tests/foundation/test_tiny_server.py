"""The real tiny-llama server answers SGLang's native and OpenAI routes, with the plugin live."""

from __future__ import annotations

import pytest

import openai
import requests

from sgl_blend.launch.supervisor import ServerProcess

pytestmark = pytest.mark.server


def test_generate_returns_text(tiny_server: ServerProcess) -> None:
    response = requests.post(
        f"{tiny_server.base_url}/generate",
        json={"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
        timeout=60,
    )
    response.raise_for_status()
    body = response.json()
    assert body["text"]
    assert body["meta_info"]["completion_tokens"] == 8


def test_chat_completion_returns_text(tiny_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused")
    completion = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Say hello"}], max_tokens=8, temperature=0
    )
    assert completion.choices[0].message.content
    assert completion.usage.completion_tokens == 8


def test_plugin_reports_from_the_scheduler_process(tiny_server: ServerProcess) -> None:
    info = requests.get(f"{tiny_server.base_url}/server_info", timeout=30).json()
    state = info["internal_states"][0]["sgl_blend"]
    assert state["version"]
    assert state["pid"] not in (tiny_server.process.pid, None)
    assert state["cpu_kernel_stub"] is True
