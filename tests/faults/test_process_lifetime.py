"""A server's processes live and die with the command that started them.

`sgl-blend serve` and `sgl-blend run-batch` are real commands here, each killed with SIGKILL alone
(not its process group): nothing of the server under it may survive, a second `serve` on a busy
port is refused, and a restart on the same port and data directory finishes the batch that was cut
off, with 0 violations.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.store import BatchStore
from tests.batch.helpers import chat_lines, create_batch, jsonl, wait_until
from tests.conftest import free_port
from tests.faults.invariants import violations
from tests.waiting import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.server]
API_KEY = "sk-lifetime"


def serve(port: int, data_dir: Path, log: Path) -> subprocess.Popen:
    """`sgl-blend serve` as a user runs it, its output in ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "sgl_blend.cli", "serve", "--model", "tiny-llama",
                                 "--port", str(port), "--data-dir", str(data_dir), "--api-key", API_KEY],
                                stdout=out, stderr=subprocess.STDOUT)


def healthy(command: subprocess.Popen, port: int) -> bool:
    assert command.poll() is None, f"the command exited with {command.returncode}"
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_alone_and_wait_for_tree(command: subprocess.Popen) -> None:
    """SIGKILL the command only (as the OOM killer would), then wait until every process that was
    under it is gone."""
    tree = psutil.Process(command.pid).children(recursive=True)
    assert tree, "the command runs a server"
    os.kill(command.pid, signal.SIGKILL)
    command.wait()
    wait_for(lambda: not any(alive(process) for process in tree),
             "every process of the killed command's server to exit")


def test_kill_9_of_serve_takes_its_server_and_a_restart_finishes_the_batch(tmp_path: Path) -> None:
    port, data_dir, log = free_port(), tmp_path / "data", tmp_path / "serve.log"
    first = serve(port, data_dir, log)
    try:
        wait_for(lambda: healthy(first, port), "the first server to be healthy")
        refused = subprocess.run([sys.executable, "-m", "sgl_blend.cli", "serve", "--model", "tiny-llama",
                                  "--port", str(port), "--data-dir", str(tmp_path / "other")],
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1 and "already in use" in refused.stderr, refused.stderr

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0)
        lines = chat_lines(4, "quick", max_tokens=2) + chat_lines(16, "slow", max_tokens=96)
        batch_id = create_batch(client, lines).id
        wait_until(client, batch_id, lambda batch: batch.request_counts.completed >= 4)
        kill_alone_and_wait_for_tree(first)
    finally:
        first.kill()

    second = serve(port, data_dir, log)
    try:
        wait_for(lambda: healthy(second, port), "the restarted server to be healthy")
        assert wait_until(client, batch_id).status == "completed"
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=120)
    store = BatchStore.open("", data_dir)  # once no server holds the data directory
    try:
        assert violations(store, BlobDir(data_dir), batch_id, [line["custom_id"] for line in lines]) == []
    finally:
        store.close()


def test_kill_9_of_run_batch_takes_its_server(tmp_path: Path) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(jsonl(chat_lines(400, "job", max_tokens=32)))
    job = subprocess.Popen([sys.executable, "-m", "sgl_blend.cli", "run-batch", "-i", str(source), "-o", str(output),
                            "--model", "tiny-llama", "--no-progress", "--port", str(free_port())],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: output.exists() and output.stat().st_size, "the job to write its first results")
        commands = [" ".join(process.cmdline()) for process in psutil.Process(job.pid).children(recursive=True)]
        assert any("sgl_blend.launch.http_process" in command for command in commands), commands
        kill_alone_and_wait_for_tree(job)
    finally:
        job.kill()
