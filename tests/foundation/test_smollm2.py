"""SmolLM2-135M-Instruct, converted from PyPI's GGUF, answers in English through the real server."""

from __future__ import annotations

import pytest

import re

import openai

from tests.conftest import launch

pytestmark = pytest.mark.server


def test_smollm2_answers_a_chat_prompt(tmp_path) -> None:
    server = launch("smollm2-135m", tmp_path)
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        completion = client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24,
            temperature=0,
        )
    finally:
        server.stop()
    text = completion.choices[0].message.content
    words = re.findall(r"[A-Za-z]+", text)
    assert len(words) >= 3, text
    assert "Paris" in text, text
