"""One executor: `sgl-blend run-batch` runs its file through the Batch API's runner, inside the server
it starts, so the same file gets the same answers either way, and hostile lines fail alone, with the
same error, in both: a document nested 100,000 deep, a 5,000-digit number, invalid UTF-8, a line
over the size limit. The command behaves as a user expects: an output folder that does not exist is
made, an empty input fails as the Batch API fails it, and a finished job says so without a server.
"""

from __future__ import annotations

import pytest

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai

from sgl_blend.launch.supervisor import ServerProcess
from tests.batch.conftest import MAX_LINE_BYTES
from tests.batch.helpers import chat_line, jsonl, records, wait_until

pytestmark = pytest.mark.server

HOSTILE = {
    "nested": b"[" * 100_000 + b"]" * 100_000,
    "huge number": b'{"custom_id": "huge", "x": ' + b"9" * 5000 + b"}",
    "invalid utf-8": b'{"custom_id": "bad-utf8", "note": "\xff\xfe"}',
    "too long": json.dumps(chat_line("long", text="w" * MAX_LINE_BYTES)).encode(),
}
EXPECTED_CODES = {"nested": "invalid_json", "huge number": "invalid_json", "invalid utf-8": "invalid_json",
                  "too long": "line_too_long"}


def batch_file() -> tuple[bytes, list[str]]:
    """Good chat lines with the hostile ones between them; the good lines' custom_ids."""
    good = [chat_line(f"good-{index}", max_tokens=3 + index % 4) for index in range(12)]
    lines = [*jsonl(good[:6]).splitlines(), *HOSTILE.values(), *jsonl(good[6:]).splitlines()]
    return b"\n".join(lines) + b"\n", [line["custom_id"] for line in good]


def answers(rows: list[dict[str, Any]]) -> dict[str, tuple[str, dict]]:
    """custom_id -> (the answer's text, its token usage)."""
    out = {}
    for row in rows:
        body = row["response"]["body"]
        usage = {key: body["usage"][key] for key in ("prompt_tokens", "completion_tokens")}
        out[row["custom_id"]] = (body["choices"][0]["message"]["content"], usage)
    return out


def errors_by_line(rows: list[dict[str, Any]]) -> dict[int, str]:
    return {row["line"]: row["error"]["code"] for row in rows}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_batch(source: Path, output: Path) -> subprocess.CompletedProcess:
    """``sgl-blend run-batch`` as a user runs it (a fresh tiny-llama server of its own)."""
    return subprocess.run([sys.executable, "-m", "sgl_blend.cli", "run-batch", "-i", str(source), "-o", str(output),
                           "--model", "tiny-llama", "--no-progress", "--max-line-bytes", str(MAX_LINE_BYTES)],
                          capture_output=True, text=True, timeout=600)


def test_run_batch_and_the_batch_api_answer_a_file_alike(batch_server: ServerProcess, client: openai.OpenAI,
                                                          tmp_path: Path) -> None:
    data, good_ids = batch_file()
    source = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_until(client, batch.id)
    assert batch.status == "completed", batch
    api_answers, api_errors = answers(records(client, batch.output_file_id)), records(client, batch.error_file_id)

    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    output = tmp_path / "not" / "yet" / "out.jsonl"
    job = run_batch(path, output)
    assert job.returncode == 0, job.stderr[-3000:]
    summary = json.loads(job.stdout)
    job_answers = answers(read_jsonl(output))
    job_errors = read_jsonl(output.with_suffix(".errors.jsonl"))

    assert sorted(api_answers) == sorted(good_ids) and api_answers == job_answers, (batch, api_errors)
    hostile_lines = {7 + index: EXPECTED_CODES[name] for index, name in enumerate(HOSTILE)}
    assert errors_by_line(api_errors) == errors_by_line(job_errors) == hostile_lines
    assert (summary["completed"], summary["failed"]) == (len(good_ids), len(HOSTILE))
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(good_ids), len(HOSTILE))

    again = run_batch(path, output)
    assert again.returncode == 0 and "already finished" in again.stderr, again.stderr[-2000:]
    assert "starting the server" not in again.stderr
    assert json.loads(again.stdout)["skipped_already_done"] == len(good_ids) + len(HOSTILE)


def test_an_empty_input_fails_as_the_batch_api_fails_it(client: openai.OpenAI, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    source = client.files.create(file=("empty.jsonl", empty.read_bytes()), purpose="batch")
    batch = wait_until(client, client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                                     completion_window="24h").id)
    assert batch.status == "failed" and [error.code for error in batch.errors.data] == ["empty_file"]

    job = run_batch(empty, tmp_path / "out" / "out.jsonl")
    assert job.returncode == 1 and "empty_file" in job.stderr, job.stderr[-2000:]
    assert "starting the server" not in job.stderr and not (tmp_path / "out" / "out.jsonl").exists()
