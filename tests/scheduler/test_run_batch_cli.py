"""`sgl-blend run-batch` end to end: interrupted with Ctrl-C, or killed with every process of the job
(its server's included), then re-run, every custom_id exactly once; a malformed line goes to the
error file and the job goes on; radix nodes carry the annotations."""

from __future__ import annotations

import pytest

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from sgl_blend.workloads.batch_files import sharegpt_lines, write_jsonl
from tests.conftest import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.server


def command(batch: Path, output: Path, max_inflight: int = 1024) -> list[str]:
    """The job runs on the annotated radix-cache backend with priority eviction, so this test also
    covers the backend: SGLang flags after the job's own pass through to the server."""
    return [sys.executable, "-m", "sgl_blend.cli", "run-batch", "-i", str(batch), "-o", str(output),
            "--model", "tiny-llama", "--port", str(free_port()), "--no-progress", "--max-inflight", str(max_inflight),
            "--radix-cache-backend", "sgl-blend", "--radix-eviction-policy", "priority"]


def custom_ids(path: Path) -> list[str]:
    return [json.loads(line)["custom_id"] for line in path.read_text().splitlines() if line.strip()]


def written_so_far(path: Path) -> int:
    """Whole result lines in a file a running job appends to (its last line may be half written)."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


def kill_job(process: subprocess.Popen) -> None:
    """SIGKILL the job and every process under it (its SGLang server runs in a session of its own)."""
    job = psutil.Process(process.pid)
    tree = [job, *job.children(recursive=True)]
    for member in tree:
        member.kill()
    psutil.wait_procs(tree, timeout=60)
    process.wait()


def test_interrupted_job_resumes_without_duplicates(tmp_path: Path) -> None:
    # Short lines: the re-run sends every line at once, and tiny-llama's CPU decode costs each
    # running line a few ms a step (torch-native attention), so 200 full ShareGPT lines took
    # over 600 s on a loaded 2-core CI machine.
    lines = sharegpt_lines(120, max_prompt_chars=600, max_tokens_cap=32)
    batch = tmp_path / "in.jsonl"
    write_jsonl(batch, lines)
    with batch.open("a") as handle:
        handle.write("{not json\n")
    output = tmp_path / "out.jsonl"
    # A few lines in flight at a time, so the job is still far from done when the 20th result
    # lands: with all 200 in one batch they finish together and the interrupt could come too late.
    first = subprocess.Popen(command(batch, output, max_inflight=8), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: first.poll() is not None or (output.exists() and len(custom_ids(output)) >= 20),
             "the job's 20th result (or its end)")
    assert first.poll() is None, f"the job ended before it could be interrupted: {first.communicate()[1][-2000:]}"
    first.send_signal(signal.SIGINT)
    _out, err = first.communicate(timeout=120)
    assert first.returncode == 130, err[-2000:]
    partial = custom_ids(output)
    assert 20 <= len(partial) < len(lines) and len(set(partial)) == len(partial)

    second = subprocess.run(command(batch, output), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    summary = json.loads(second.stdout)
    assert summary["skipped_already_done"] >= len(partial)
    assert summary["scheduler"]["counts"]["annotated_nodes"] > 0
    done = custom_ids(output)
    assert sorted(done) == sorted(line["custom_id"] for line in lines)
    errors = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert [error["error"]["code"] for error in errors] == ["invalid_json"]


def test_a_killed_job_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    lines = sharegpt_lines(120, max_tokens_cap=96)
    batch = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    first = subprocess.Popen(command(batch, output, max_inflight=8), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    job = psutil.Process(first.pid)
    wait_for(lambda: first.poll() is not None or written_so_far(output) >= 20, "the job's 20th result (or its end)")
    assert first.poll() is None, "the job ended before it could be killed"
    tree = [job, *job.children(recursive=True)]
    kill_job(first)
    assert not [member for member in tree if member.is_running() and member.status() != psutil.STATUS_ZOMBIE]

    second = subprocess.run(command(batch, output), capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert sorted(custom_ids(output)) == sorted(line["custom_id"] for line in lines)
    assert json.loads(second.stdout)["skipped_already_done"] > 0
