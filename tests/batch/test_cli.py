"""`sgl-blend batch` against the shared server, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sgl_blend.launch.supervisor import ServerProcess
from tests.batch.conftest import API_KEY
from tests.batch.helpers import chat_lines, jsonl


def sgl_blend(*args: str, key: str | None = API_KEY, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SGLBLEND_URL": url}
    env.pop("SGLBLEND_API_KEY", None)
    if key:
        env["SGLBLEND_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "sgl_blend.cli", "batch", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_submit_wait_status_list_download_cancel(batch_server: ServerProcess, tmp_path: Path) -> None:
    url = batch_server.base_url
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([*chat_lines(5, "cli"), "{not json"]))

    submitted = sgl_blend("submit", str(source), "--wait", "-o", str(tmp_path / "out"), "--metadata", "run=cli",
                          url=url)
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    batch_id = submitted.stdout.splitlines()[0]
    assert batch_id.startswith("batch_")
    output, errors = tmp_path / "out" / f"{batch_id}_output.jsonl", tmp_path / "out" / f"{batch_id}_errors.jsonl"
    assert sorted(json.loads(line)["custom_id"] for line in output.read_text().splitlines()) == \
        [f"cli-{index}" for index in range(5)]
    assert json.loads(errors.read_text())["error"]["code"] == "invalid_json"

    status = sgl_blend("status", batch_id, url=url)
    batch = json.loads(status.stdout)
    assert batch["status"] == "completed" and batch["metadata"] == {"run": "cli"}
    assert batch["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    assert batch_id in sgl_blend("list", "--limit", "5", url=url).stdout

    fetched = sgl_blend("download", batch_id, "-o", str(tmp_path / "again"), url=url)
    assert fetched.returncode == 0 and (tmp_path / "again" / output.name).read_bytes() == output.read_bytes()

    refused = sgl_blend("cancel", batch_id, url=url)
    assert refused.returncode == 1 and "409" in refused.stderr
    unauthorized = sgl_blend("status", batch_id, key=None, url=url)
    assert unauthorized.returncode == 1 and "401" in unauthorized.stderr
