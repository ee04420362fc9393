"""A batch line run in-process (SGLang's own handlers, called by the runner in the server's process)
gives the record the same request gets through the HTTP route: chat, completion, logprobs, ``n =
3``, and a body SGLang refuses when it runs it. Ids and timestamps differ by nature, and so does the
cached-token count (the second time round the prompt is in the radix cache). Logprobs are compared
within 1e-4: the batch ran its lines together and the HTTP replay runs them alone, so the float32
sums take another order and differ in the seventh digit (seen in CI: -6.4771485 vs -6.4771481).
A tolerance, not rounding: two values that close can still round apart."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from sgl_blend.launch.supervisor import ServerProcess
from tests.batch.conftest import API_KEY
from tests.batch.helpers import create_batch, records, wait_until

pytestmark = pytest.mark.server

VARYING = ("id", "created", "cached_tokens")
LOGPROB_TOLERANCE = 1e-4


def line(custom_id: str, url: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": "tiny-llama", "temperature": 0, "ignore_eos": True, "max_tokens": 6, **body}}


CHAT, COMPLETION = "/v1/chat/completions", "/v1/completions"
LINES = {
    CHAT: [line("chat", CHAT, messages=[{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Name a river."}]),
           line("chat-logprobs", CHAT, messages=[{"role": "user", "content": "Name a lake."}], logprobs=True,
                top_logprobs=2),
           line("chat-n3", CHAT, messages=[{"role": "user", "content": "Name a sea."}], n=3),
           # valid for SGLang's request model, refused when it runs: longer than the model's context
           line("chat-refused", CHAT, messages=[{"role": "user", "content": "Name an ocean."}], max_tokens=100_000)],
    COMPLETION: [line("text", COMPLETION, prompt="The longest river is"),
                 line("text-logprobs", COMPLETION, prompt="The deepest lake is", logprobs=2)],
}


def without_varying(value: Any, *, approximate: bool = False) -> Any:
    """The record less what differs by nature; with ``approximate``, its floats match within the
    tolerance (one side of a comparison only)."""
    if isinstance(value, dict):
        return {key: without_varying(item, approximate=approximate) for key, item in value.items()
                if key not in VARYING}
    if isinstance(value, list):
        return [without_varying(item, approximate=approximate) for item in value]
    if approximate and isinstance(value, float):
        return pytest.approx(value, abs=LOGPROB_TOLERANCE)
    return value


def test_a_line_run_in_process_answers_as_the_http_route_does(batch_server: ServerProcess,
                                                               client: openai.OpenAI) -> None:
    batch_records = {}
    for url, lines in LINES.items():
        batch = wait_until(client, create_batch(client, lines, endpoint=url).id)
        assert batch.status == "completed", batch
        for record in records(client, batch.output_file_id) + records(client, batch.error_file_id):
            batch_records[record["custom_id"]] = record["response"]
    with httpx.Client(base_url=batch_server.base_url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=120) as http:
        for url, lines in LINES.items():
            for sent in lines:
                answer = http.post(url, json=sent["body"])
                response = batch_records[sent["custom_id"]]
                assert response["status_code"] == answer.status_code, sent["custom_id"]
                assert without_varying(response["body"]) == without_varying(answer.json(), approximate=True), \
                    sent["custom_id"]
    assert batch_records["chat-refused"]["status_code"] == 400
    assert len(batch_records["chat-n3"]["body"]["choices"]) == 3
    assert batch_records["chat-logprobs"]["body"]["choices"][0]["logprobs"]["content"]
