"""The Files and Batches API end to end: a real tiny-llama server, the official `openai` client."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import update

from sgl_blend.client import http
from sgl_blend.launch.supervisor import ServerProcess
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.ids import new_batch_id, new_file_id
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import BatchRow, BatchStore, key_owner
from sgl_blend.server.store_schema import batches
from tests.batch.conftest import API_KEY, MAX_FILE_BYTES, MAX_FILE_LINES
from tests.batch.helpers import (WAIT_LIMIT_S, chat_line, chat_lines, create_batch, jsonl, mixed_lines, records,
                                 upload, wait_until)
from tests.waiting import wait_for_async

pytestmark = pytest.mark.server


def test_happy_path(client: openai.OpenAI) -> None:
    lines = chat_lines(12, "happy")
    created = create_batch(client, lines, metadata={"team": "eval"},
                           output_expires_after={"anchor": "created_at", "seconds": 7200})
    assert created.status == "validating" and created.id.startswith("batch_")
    assert created.expires_at == created.created_at + 24 * 3600  # the completion window

    batch = wait_until(client, created.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 12, "completed": 12, "failed": 0}
    assert batch.metadata == {"team": "eval"} and batch.error_file_id is None and batch.errors is None
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.usage.output_tokens == 12 * 4 and batch.usage.input_tokens > 0

    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.expires_at == output.created_at + 7200
    results = records(client, batch.output_file_id)
    assert output.bytes == len(client.files.content(batch.output_file_id).content)
    assert sorted(record["custom_id"] for record in results) == sorted(line["custom_id"] for line in lines)
    for record in results:
        assert record["error"] is None and record["response"]["status_code"] == 200
        assert record["response"]["body"]["usage"]["completion_tokens"] == 4
        assert record["response"]["body"]["choices"][0]["message"]["content"]


def test_completions_endpoint(client: openai.OpenAI) -> None:
    lines = [{"custom_id": f"text-{index}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "tiny-llama", "prompt": f"Once upon a time {index}", "max_tokens": 3,
                       "ignore_eos": True}} for index in range(4)]
    batch = wait_until(client, create_batch(client, lines, endpoint="/v1/completions").id)
    assert batch.status == "completed" and batch.request_counts.completed == 4
    for record in records(client, batch.output_file_id):
        assert record["response"]["body"]["object"] == "text_completion"
        assert record["response"]["body"]["usage"]["completion_tokens"] == 3


def test_fifty_lines_three_malformed(client: openai.OpenAI) -> None:
    lines: list = chat_lines(47, "mixed")
    missing_id = chat_line("unused")
    del missing_id["custom_id"]
    wrong_url = {**chat_line("wrong-url"), "url": "/v1/completions"}
    lines[10:10] = ['{"custom_id": "broken", "method": "POST"']
    lines[20:20] = [missing_id]
    lines[30:30] = [wrong_url]
    batch = wait_until(client, create_batch(client, lines).id)

    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 50, "completed": 47, "failed": 3}
    assert len(records(client, batch.output_file_id)) == 47
    errors = records(client, batch.error_file_id)
    assert sorted((error["line"], error["error"]["code"]) for error in errors) == [
        (11, "invalid_json"), (21, "missing_custom_id"), (31, "invalid_url")]
    assert all(error["response"] is None for error in errors)


def test_each_bad_line_fails_alone(client: openai.OpenAI) -> None:
    """A repeated custom_id, a body without messages, a streaming body and a body SGLang itself
    rejects each fail only their own line."""
    engine_rejects = chat_line("bad-sampling")
    engine_rejects["body"]["temperature"] = -3
    no_messages = chat_line("no-messages")
    del no_messages["body"]["messages"]
    streaming = chat_line("streaming")
    streaming["body"]["stream"] = True
    lines = [chat_line("first"), chat_line("first"), no_messages, streaming, engine_rejects, chat_line("last")]
    batch = wait_until(client, create_batch(client, lines).id)

    assert batch.status == "completed"
    assert sorted(record["custom_id"] for record in records(client, batch.output_file_id)) == ["first", "last"]
    errors = {error["custom_id"]: error for error in records(client, batch.error_file_id)}
    assert errors[None]["error"]["code"] == "duplicate_custom_id" and errors[None]["line"] == 2
    assert errors["no-messages"]["error"]["code"] == "invalid_body"
    assert errors["streaming"]["error"]["code"] == "invalid_body"
    assert errors["bad-sampling"]["error"] is None and errors["bad-sampling"]["response"]["status_code"] == 400


def test_embeddings_lines_fail_alone_on_a_generation_model(client: openai.OpenAI) -> None:
    lines = [{"custom_id": f"emb-{index}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "tiny-llama", "input": f"text {index}"}} for index in range(3)]
    batch = wait_until(client, create_batch(client, lines, endpoint="/v1/embeddings").id)

    assert batch.status == "completed" and batch.output_file_id is None
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 0, "failed": 3}
    for error in records(client, batch.error_file_id):
        assert 400 <= error["response"]["status_code"] < 500, error


def test_cancel_mid_run_keeps_partial_output(client: openai.OpenAI) -> None:
    created = create_batch(client, mixed_lines("cancel"))
    wait_until(client, created.id, lambda batch: batch.request_counts.completed >= 5)
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at

    batch = wait_until(client, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    results = records(client, batch.output_file_id)
    assert 5 <= len(results) == batch.request_counts.completed < batch.request_counts.total
    assert len({record["custom_id"] for record in results}) == len(results)
    for record in results:
        assert record["response"]["status_code"] == 200
        assert record["response"]["body"]["choices"][0]["message"]["content"]
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(created.id)


def test_completion_window_expiry(client: openai.OpenAI, batch_server: ServerProcess, batch_store_url: str,
                                  batch_work_dir: Path) -> None:
    """A batch whose window has passed when the server's runner takes it up mid-run: the lines
    done so far are its output, every other line a `batch_expired` error, and nothing more runs.

    A runner of the test's own starts the batch (holding its lease, on the server's store and data
    directory) and completes a few lines one at a time; in one step of its event loop the test moves
    ``expires_at`` into the past and stops it, so no line can finish after that. The server's own
    runner then takes the batch up and must expire it, however fast the engine is."""
    lines = chat_lines(30, "expire")
    store, blobs = BatchStore.open(batch_store_url, batch_work_dir / "data"), BlobDir(batch_work_dir / "data")
    now = int(time.time())
    batch_id = new_batch_id()
    store.add_batch(BatchRow(batch_id, "/v1/chat/completions", upload(client, lines), "24h", "validating", now,
                             now + 24 * 3600, output_blob=new_file_id(), error_blob=new_file_id(),
                             owner="expiry-test", lease_until=now + WAIT_LIMIT_S), owner=key_owner(API_KEY))
    runner = BatchRunner(store, blobs, workers=[batch_server.base_url], owner="expiry-test", api_key=API_KEY,
                         max_inflight=1)

    async def run_a_few_lines_then_expire() -> None:
        task = asyncio.create_task(runner.run())
        try:
            await wait_for_async(lambda: store.get_batch(batch_id).completed >= 3, "three lines done")
            with store.db.transaction() as connection:
                connection.execute(update(batches).where(batches.c.id == batch_id)
                                   .values(expires_at=int(time.time()) - 1))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run_a_few_lines_then_expire())
    ran = {line.custom_id for line in store.lines(batch_id) if line.state == "completed"}
    store.close()
    assert 3 <= len(ran) < len(lines), "the window closed mid-batch"

    batch = wait_until(client, batch_id)
    assert batch.status == "expired" and batch.in_progress_at <= batch.expired_at
    assert batch.expires_at < batch.expired_at and batch.completed_at is None
    assert batch.request_counts.model_dump() == {"total": len(lines), "completed": len(ran),
                                                 "failed": len(lines) - len(ran)}
    done, expired = records(client, batch.output_file_id), records(client, batch.error_file_id)
    assert {record["custom_id"] for record in done} == ran  # exactly what ran before the window closed
    assert {error["error"]["code"] for error in expired} == {"batch_expired"}
    assert all(error["response"] is None for error in expired)
    assert sorted(record["custom_id"] for record in done + expired) == sorted(line["custom_id"] for line in lines)


def test_two_batches_and_online_chat(client: openai.OpenAI) -> None:
    first = create_batch(client, chat_lines(60, "one", max_tokens=16))
    second = create_batch(client, chat_lines(60, "two", max_tokens=16))

    def chat(index: int) -> str:
        reply = client.chat.completions.create(model="tiny-llama", max_tokens=8, temperature=0,
                                               messages=[{"role": "user", "content": f"online question {index}"}])
        return reply.choices[0].finish_reason

    with ThreadPoolExecutor(8) as pool:
        online = list(pool.map(chat, range(8)))
    assert len(online) == 8 and all(online)
    for created, prefix in ((first, "one"), (second, "two")):
        batch = wait_until(client, created.id)
        assert batch.status == "completed" and batch.request_counts.completed == 60
        assert sorted(r["custom_id"] for r in records(client, batch.output_file_id)) == \
            sorted(f"{prefix}-{index}" for index in range(60))


def test_every_route_needs_the_api_key(batch_server: ServerProcess, client: openai.OpenAI) -> None:
    file_id = upload(client, chat_lines(1, "auth"))
    routes = [("POST", "/v1/files"), ("GET", "/v1/files"), ("GET", f"/v1/files/{file_id}"),
              ("GET", f"/v1/files/{file_id}/content"), ("DELETE", f"/v1/files/{file_id}"),
              ("POST", "/v1/batches"), ("GET", "/v1/batches"), ("GET", "/v1/batches/batch_x"),
              ("POST", "/v1/batches/batch_x/cancel")]
    for method, path in routes:
        for headers in ({}, http.auth_headers("wrong")):
            response = httpx.request(method, batch_server.base_url + path, headers=headers)
            assert response.status_code == 401, (method, path, response.text)
    stranger = openai.OpenAI(base_url=f"{batch_server.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.files.content(file_id)
    with pytest.raises(openai.AuthenticationError):
        stranger.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert client.files.retrieve(file_id).id == file_id


def test_upload_limits(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as too_big:
        client.files.create(file=("big.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose="batch")
    assert too_big.value.status_code == 413 and too_big.value.body["code"] == "file_too_large"
    exactly = client.files.create(file=("edge.jsonl", b"y" * MAX_FILE_BYTES), purpose="batch",
                                  expires_after={"anchor": "created_at", "seconds": 3600})
    assert exactly.bytes == MAX_FILE_BYTES and len(client.files.content(exactly.id).content) == MAX_FILE_BYTES
    assert exactly.expires_at == exactly.created_at + 3600

    with pytest.raises(openai.BadRequestError) as wrong_purpose:
        client.files.create(file=("a.jsonl", jsonl(chat_lines(1))), purpose="assistants")
    assert wrong_purpose.value.body["param"] == "purpose"

    batch = wait_until(client, create_batch(client, chat_lines(MAX_FILE_LINES + 1, "many", max_tokens=1)).id)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert [error.code for error in batch.errors.data] == ["too_many_requests"]
    empty = wait_until(client, create_batch(client, ["", "  "]).id)
    assert empty.status == "failed" and empty.errors.data[0].code == "empty_file"


def test_list_pagination(client: openai.OpenAI) -> None:
    made = [create_batch(client, chat_lines(1, f"page{index}", max_tokens=1)).id for index in range(5)]
    first_page = client.batches.list(limit=2)
    assert [batch.id for batch in first_page.data] == made[::-1][:2] and first_page.has_more
    second_page = client.batches.list(limit=2, after=made[3])
    assert [batch.id for batch in second_page.data] == [made[2], made[1]]
    listed = [batch.id for batch in client.batches.list(limit=2)]  # the client follows the cursor
    assert listed[:5] == made[::-1] and len(listed) == len(set(listed))

    file_ids = [upload(client, chat_lines(1, f"f{index}")) for index in range(3)]
    ascending = [f.id for f in client.files.list(limit=1, order="asc", purpose="batch")]
    assert ascending[-3:] == file_ids
    with pytest.raises(openai.BadRequestError):
        client.batches.list(limit=101)
    for batch_id in made:
        assert wait_until(client, batch_id).status == "completed"


def test_bad_requests_get_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_" + "0" * 32)
    with pytest.raises(openai.NotFoundError):
        client.files.content("../../etc/passwd")
    file_id = upload(client, chat_lines(40, "busy", max_tokens=8))
    with pytest.raises(openai.BadRequestError) as bad_endpoint:
        client.batches.create(input_file_id=file_id, endpoint="/v1/responses", completion_window="24h")
    assert bad_endpoint.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="1d")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={"k": "v" * 513})

    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.ConflictError):
        client.files.delete(file_id)
    assert wait_until(client, batch.id).status == "completed"
    assert client.files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    raw = httpx.post(f"{client.base_url}batches", content=b"{not json",
                     headers={**http.auth_headers(API_KEY), "Content-Type": "application/json"})
    assert raw.status_code == 400 and json.loads(raw.text)["error"]["type"] == "invalid_request_error"
