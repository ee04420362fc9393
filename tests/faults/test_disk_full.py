"""A full disk under a running batch: the data directory is a small tmpfs, filled to the last byte
while the batch runs. The batch pauses visibly -- it stays in progress with a ``disk_full`` entry in
its errors, and no line is sent again while it waits -- and once space is freed it completes with
0 violations, each line having gone to the engine exactly once. The store is PostgreSQL, off the
full disk, so the pause can be shown through the API (a SQLite store on the same disk can only log it)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from sgl_blend.client import http
from sgl_blend.launch.supervisor import ServerProcess
from tests.batch.conftest import API_KEY
from tests.faults.helpers import all_violations, finished, fresh_store, new_batch, opened, running
from tests.faults.runner_process import RunnerConfig
from tests.waiting import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.server]
TMPFS_SIZE = "8m"
# The promise: a full disk shows on the batch within this long.
VISIBLE_WITHIN_S = 60.0


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("this test mounts a tmpfs, which needs root (CI runs as root)")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(path: Path) -> None:
    """Write ``path`` until the disk refuses another byte."""
    with path.open("wb", buffering=0) as filler:
        block = b"\0" * (1 << 16)
        try:
            while True:
                filler.write(block)
        except OSError as error:
            assert error.errno == errno.ENOSPC
        try:
            while True:
                filler.write(b"\0")
        except OSError as error:
            assert error.errno == errno.ENOSPC


def submitted(server: ServerProcess) -> int:
    """Offline requests the engine has taken in, from its `/server_info`."""
    offline = http.server_info(server.base_url, API_KEY)["internal_states"][0]["sgl_blend"]["offline"] or {}
    return (offline.get("counts") or {}).get("submitted", 0)


def test_a_full_disk_pauses_the_batch_until_space_is_freed(small_disk: Path, postgres_url: str,
                                                           batch_server: ServerProcess, tmp_path: Path) -> None:
    store_url, data_dir = fresh_store("postgresql", postgres_url), small_disk / "data"
    batch_id, custom_ids = new_batch(store_url, data_dir, lines=30, max_tokens=8)
    before = submitted(batch_server)
    config = RunnerConfig(store_url, data_dir, batch_server.base_url, API_KEY, owner="disk-runner",
                          log_path=tmp_path / "runner.log", max_inflight=2)
    filler = small_disk / "filler"
    with running(config) as runner, opened(store_url, data_dir) as store:
        wait_for(lambda: store.get_batch(batch_id).completed >= 3, "three lines committed")
        fill(filler)
        paused = wait_for(lambda: (row := store.get_batch(batch_id)).errors and row, "the pause to show",
                          timeout_s=VISIBLE_WITHIN_S)
        assert paused.status == "in_progress" and [error["code"] for error in paused.errors] == ["disk_full"]
        assert runner.is_alive() and paused.completed < len(custom_ids)
        filler.unlink()
        finished(runner, config)
        assert store.get_batch(batch_id).errors is None
    assert all_violations(store_url, data_dir, {batch_id: custom_ids}) == []
    assert submitted(batch_server) - before == len(custom_ids), "every line went to the engine exactly once"
