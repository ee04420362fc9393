"""Transient errors on 5% of lines fail no line: a runner of the test's own sends a batch through the
line route of the shared real tiny-llama server, behind a real fault-injecting proxy
(`tests.faults.fault_proxy`), which answers 503 instead, breaks the answer's stream mid-chunk
after the engine got the lines, or aborts a line unasked; every line completes, each exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from sgl_blend.launch.supervisor import ServerProcess
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.runner import BatchRunner
from sgl_blend.server.store import BatchStore
from tests.batch.conftest import API_KEY
from tests.batch.helpers import WAIT_LIMIT_S, add_batch, chat_lines, run_until
from tests.faults.fault_proxy import FAULTS, FaultProxy
from tests.faults.invariants import violations

pytestmark = [pytest.mark.faults, pytest.mark.server]
LINES = 240


def test_transient_errors_on_5_percent_of_lines_fail_no_line(batch_server: ServerProcess, tmp_path: Path) -> None:
    store, blobs = BatchStore.open("", tmp_path), BlobDir(tmp_path)
    lines = chat_lines(LINES, "flaky", max_tokens=2)
    try:
        batch_id = add_batch(store, blobs, lines, owner="flaky-runner")
        with FaultProxy(batch_server.base_url, rate=0.05) as proxy:
            runner = BatchRunner(store, blobs, workers=[proxy.url], owner="flaky-runner", api_key=API_KEY,
                                 max_inflight=32, lease_s=WAIT_LIMIT_S)
            run_until(runner, lambda: store.get_batch(batch_id).status == "completed", "the batch to complete")
        assert all(proxy.seen[fault] >= 2 for fault in FAULTS), proxy.seen
        assert store.get_batch(batch_id).failed == 0
        assert violations(store, blobs, batch_id, [line["custom_id"] for line in lines]) == []
    finally:
        store.close()
