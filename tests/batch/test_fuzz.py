"""Fuzzing the Batch API's input (hypothesis): batch lines and multipart upload bodies.

- Any bytes at all make one line: `parse_line` never raises, and says either what runs (a body
  SGLang's request model accepts, within the caps, sent as JSON without the executor's fields) or
  why not, with a code the error file knows.
- A batch of hostile lines run end to end by a runner of the test's own on the shared real server
  gets exactly one error record per bad line (by its line number) and one answer per good one.
- Hostile multipart bodies never break the upload route (an answer, never a 5xx or a dropped
  connection), and the server's peak memory stays within the upload cap plus 256 MB, read from the
  kernel (``VmHWM``) of an API-only server process (`tests.batch.api_only`).
"""

from __future__ import annotations

import pytest

import json
import time
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sgl_blend.batch_lines.bodies import BodyCaps
from sgl_blend.batch_lines.lines import EXECUTOR_FIELDS, SUPPORTED_URLS, BatchLine, LineError, parse_line
from sgl_blend.client import http
from sgl_blend.launch.supervisor import ServerProcess
from sgl_blend.server.auth import BatchKeys
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.ids import new_batch_id, new_file_id
from sgl_blend.server.store import BatchRow, BatchStore, FileRow
from tests.batch.api_only import api_only_server
from tests.batch.conftest import API_KEY
from tests.batch.helpers import WAIT_LIMIT_S, chat_line, run_until

LINE_ERROR_CODES = {"invalid_json", "invalid_request", "missing_custom_id", "invalid_url", "invalid_method",
                    "invalid_body", "line_too_long", "duplicate_custom_id"}
CAPS = BodyCaps(max_n=4, max_tokens=64)
MAX_LINE_BYTES = 4096
UPLOAD_CAP = 1024 * 1024
MEMORY_ROOM = 256 * 1024 * 1024

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=4), max_leaves=12)
messages = st.one_of(json_values, st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "nobody"]),
     "content": st.one_of(st.text(max_size=30), json_values)}), max_size=3))
bodies = st.fixed_dictionaries({}, optional={
    "model": st.text(max_size=10), "messages": messages, "prompt": json_values | st.text(max_size=30),
    "input": json_values, "max_tokens": st.integers(-5, 10**13) | json_values, "n": st.integers(-2, 50) | json_values,
    "max_completion_tokens": st.integers(-5, 10**6), "best_of": st.integers(0, 30), "stream": st.booleans(),
    "temperature": st.floats() | json_values, "rid": st.text(max_size=5), "routed_dp_rank": json_values})
records = st.fixed_dictionaries({}, optional={
    "custom_id": st.text(max_size=12) | json_values, "method": st.sampled_from(["POST", "GET"]) | json_values,
    "url": st.sampled_from([*SUPPORTED_URLS, "/v1/responses"]) | json_values, "body": bodies | json_values})
raw_lines = st.one_of(records.map(lambda record: json.dumps(record).encode()), st.binary(max_size=300),
                      st.text(max_size=200).map(str.encode), st.integers(1, 3000).map(lambda depth: b"[" * depth),
                      st.just(b'{"custom_id": "x", "url": "/v1/chat/completions", "body": {"n": 1' + b"0" * 5000 + b"}}"))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=raw_lines)
def test_any_line_either_runs_or_says_why(raw: bytes) -> None:
    parsed = parse_line(raw, 7, SUPPORTED_URLS, MAX_LINE_BYTES, CAPS)
    assert isinstance(parsed, (BatchLine, LineError)) and parsed.line_number == 7
    if isinstance(parsed, LineError):
        assert parsed.code in LINE_ERROR_CODES and parsed.message
        return
    sent = json.loads(parsed.request.body)
    assert parsed.url in SUPPORTED_URLS and not parsed.body.get("stream")
    assert not set(EXECUTOR_FIELDS) & set(sent)
    assert all(sent.get(name) is None or 1 <= sent[name] <= CAPS.max_n for name in ("n", "best_of"))
    assert all(sent.get(name) is None or 0 <= sent[name] <= CAPS.max_tokens
               for name in ("max_tokens", "max_completion_tokens"))


bad_lines = st.one_of(raw_lines, st.just(b""), st.just(b"   "))


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(mixed=st.lists(st.one_of(bad_lines, st.integers(0, 10**6).map(lambda n: json.dumps(chat_line(f"good-{n}", 1))
                                                                     .encode())), min_size=20, max_size=60))
@pytest.mark.server
def test_one_error_record_per_bad_line(mixed: list[bytes], batch_server: ServerProcess, tmp_path_factory) -> None:
    root = tmp_path_factory.mktemp("fuzz-batch")
    content = [line.replace(b"\n", b" ").replace(b"\r", b" ") for line in mixed] + [json.dumps(chat_line("anchor", 1))
                                                                                    .encode()]
    numbered = [(number, line) for number, line in enumerate(content, start=1) if line.strip()]
    expected = {number: parse_line(line, number, ("/v1/chat/completions",)) for number, line in numbered}
    store, blobs = BatchStore.open("", root), BlobDir(root)
    try:
        batch_id = _batch_of_raw_lines(store, blobs, content)
        runner = BatchRunner(store, blobs, workers=[batch_server.base_url], owner="fuzz", api_key=API_KEY,
                             max_inflight=16, lease_s=WAIT_LIMIT_S)
        run_until(runner, lambda: store.get_batch(batch_id).status == "completed", "the fuzzed batch to complete")
        row = store.get_batch(batch_id)
        errors = _records(blobs, row.error_file_id)
        outputs = _records(blobs, row.output_file_id)
    finally:
        store.close()
    assert row.total == len(numbered) == row.completed + row.failed
    bad = sorted(number for number, parsed in expected.items() if isinstance(parsed, LineError)
                 or parsed.custom_id in {other.custom_id for earlier, other in expected.items()
                                         if earlier < number and isinstance(other, BatchLine)})
    assert sorted(record["line"] for record in errors if record.get("line")) == bad  # one record per bad line
    assert len(outputs) + len([record for record in errors if not record.get("line")]) == len(numbered) - len(bad)


def _batch_of_raw_lines(store: BatchStore, blobs: BlobDir, content: list[bytes]) -> str:
    """A chat batch whose input is ``content``, line by line, held by the test's runner."""
    source, now = new_file_id(), int(time.time())
    blobs.path(source).write_bytes(b"\n".join(content) + b"\n")
    store.add_file(FileRow(source, "batch", "fuzz.jsonl", blobs.path(source).stat().st_size, now))
    batch = BatchRow(new_batch_id(), "/v1/chat/completions", source, "24h", "validating", now, now + 3600,
                     output_blob=new_file_id(), error_blob=new_file_id(), owner="fuzz", lease_until=now + WAIT_LIMIT_S)
    store.add_batch(batch)
    return batch.id


def _records(blobs: BlobDir, file_id: str | None) -> list[dict[str, Any]]:
    return [json.loads(line) for line in blobs.path(file_id).read_bytes().splitlines()] if file_id else []


part_names = st.sampled_from(["file", "purpose", "expires_after[anchor]", "expires_after[seconds]", "x", ""])
parts = st.lists(st.tuples(part_names, st.booleans(), st.one_of(st.binary(max_size=2000),
                                                                st.integers(0, 3 * UPLOAD_CAP).map(lambda n: b"y" * n))),
                 max_size=20)
# Some bodies start as a real upload would (the fuzzed parts then follow), so the route's happy path is fuzzed too.
uploads = st.one_of(parts, parts.map(lambda extra: [("purpose", False, b"batch"),
                                                    ("file", True, json.dumps(chat_line("up")).encode())] + extra))
# RFC 2046's boundary characters, or any printable ones (which may not survive the header's parsing).
boundaries = st.one_of(st.text(alphabet="0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=?",
                               min_size=1, max_size=70),
                       st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=70))


def _multipart(boundary: bytes, chosen: list[tuple[str, bool, bytes]], tail: bytes) -> bytes:
    body = b""
    for name, as_file, data in chosen:
        filename = b'; filename="in.jsonl"' if as_file else b""
        body += b"--" + boundary + b'\r\nContent-Disposition: form-data; name="' + name.encode() + b'"' + filename
        body += b"\r\n\r\n" + data + b"\r\n"
    return body + tail


def _peak_memory(pid: int) -> int:
    """A process's peak resident memory, in bytes, from the kernel."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024


def test_hostile_multipart_bodies_get_an_answer_within_bounded_memory(tmp_path: Path) -> None:
    config = BatchApiConfig(data_dir=tmp_path / "data", max_file_bytes=UPLOAD_CAP)
    with api_only_server(config, BatchKeys((API_KEY,)), tmp_path / "api.log") as (url, pid):
        before = _peak_memory(pid)

        @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.data_too_large])
        @given(boundary=boundaries, chosen=uploads, tail=st.sampled_from([b"", b"--", b"--BOUNDARY--\r\n", b"\r\n--"]),
               declare_length=st.booleans())
        def post(boundary: str, chosen: list[tuple[str, bool, bytes]], tail: bytes, declare_length: bool) -> None:
            body = _multipart(boundary.encode(), chosen, tail.replace(b"BOUNDARY", boundary.encode()))
            headers = {**http.auth_headers(API_KEY), "Content-Type": "multipart/form-data; boundary=" + boundary}
            content = body if declare_length else iter([body[at:at + 65536] for at in range(0, len(body), 65536)])
            answer = httpx.post(url + "/v1/files", headers=headers, content=content, timeout=60)
            assert answer.status_code in (200, 400, 413), answer.text
            if answer.status_code != 200:
                assert set(answer.json()["error"]) == {"message", "type", "param", "code"}

        post()
        assert _peak_memory(pid) - before <= UPLOAD_CAP + MEMORY_ROOM
