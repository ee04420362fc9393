"""The plan is made on the ids the engine runs: every planned batch line's placement carries the
digest of the prompt ids its runner planned on, and the scheduler checks it against the request's
``origin_input_ids`` (`sglang_plugin.prompt_check`). One server, on a tiny-llama whose tokenizer
adds a BOS token and whose chat template writes one too (as Llama 3's does), so a prompt tokenised
by any other path than SGLang's own gets it twice or not at all.

The same batch carries an ``n = 3`` line: SGLang splits it into a request that caches the prompt and
three samples, which must each reach the scheduler as offline work with the line's placement.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest

from sgl_blend.client import http
from sgl_blend.core.placement import Placement, prompt_digest
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.models.registry import resolve_model_path
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.sglang_plugin.prompt_check import PromptCheck
from tests.batch.helpers import create_batch, wait_until
from tests.batch.key_checks import assert_open
from tests.conftest import free_port

BOS = "<|begin|>"
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Today's weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]


def bos_model(directory: Path) -> Path:
    """tiny-llama with a tokenizer that puts BOS in front of every encoding, and a chat template
    that starts with it."""
    shutil.copytree(resolve_model_path("tiny-llama"), directory)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    bos_id = next(token["id"] for token in tokenizer["added_tokens"] if token["content"] == BOS)
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS: {"id": BOS, "ids": [bos_id], "tokens": [BOS]}}}
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    template = directory / "chat_template.jinja"
    template.write_text("{{ bos_token }}" + template.read_text())
    return directory


@pytest.fixture(scope="module")
def bos_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("bos-server")
    server = start_server(str(bos_model(work / "model")), ["--port", str(free_port())], log_path=work / "server.log",
                          batch_api=BatchApiConfig(data_dir=work / "data"))
    yield server
    server.stop()


def chat(custom_id: str, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny-llama", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "messages": messages,
                     **body}}


@pytest.mark.server
def test_the_scheduler_runs_the_ids_each_line_was_planned_on(bos_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{bos_server.base_url}/v1", api_key="none", max_retries=0)
    system = {"role": "system", "content": "You answer in one word."}
    chats = [chat(f"chat-{index}", [system, {"role": "user", "content": f"Name a colour, {index}."}]) for index in range(4)]
    chats += [chat("tools", [{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS),
              chat("samples", [system, {"role": "user", "content": "Three colours, please."}], n=3)]
    completions = [{"custom_id": f"text-{index}", "method": "POST", "url": "/v1/completions",
                    "body": {"model": "tiny-llama", "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                             "prompt": f"Colour number {index} is"}} for index in range(4)]
    for lines, endpoint in ((chats, "/v1/chat/completions"), (completions, "/v1/completions")):
        batch = wait_until(client, create_batch(client, lines, endpoint=endpoint).id)
        assert batch.status == "completed" and batch.request_counts.completed == len(lines), batch

    state = http.server_info(bos_server.base_url)["internal_states"][0]["sgl_blend"]
    # every request the lines became: SGLang runs an n = 3 line as a prompt-caching request and
    # its three samples
    requests = len(chats) + 3 + len(completions)
    assert state["prompt_ids"] == {"checked": requests, "mismatched": 0}
    assert state["offline"]["counts"]["submitted"] == requests


def test_a_prompt_other_than_the_planned_one_is_counted() -> None:
    class Req:
        rid = "r"
        origin_input_ids = [0, 5, 6, 7]
        routing_key = f"sgl-blend-offline:job@{Placement('compute', 0, 1.0, 4, prompt=prompt_digest([5, 6, 7])).encode()}"

    check = PromptCheck()
    check.arrived(Req())
    Req.origin_input_ids = [5, 6, 7]
    check.arrived(Req())
    assert check.snapshot() == {"checked": 2, "mismatched": 1}


@pytest.mark.server
def test_a_server_without_keys_is_open(bos_server: ServerProcess) -> None:
    """The key gate shuts nothing on a server with no key (this module's server has none)."""
    assert_open(bos_server.base_url)
