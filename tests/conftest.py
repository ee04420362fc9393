"""Session-wide fixtures (one real tiny-llama SGLang server for every test that needs one) and the
two test tiers.

A test that starts a real server -- SGLang, the Batch API, or a `run-batch` job that launches
one -- carries the ``server`` mark (on itself or its module's ``pytestmark``): ``pytest -m "not
server"`` is the fast tier. A test that still starts one in this process without the mark fails,
naming itself, so none slips into the fast tier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from sgl_blend.launch import supervisor
from sgl_blend.launch.colocation import free_port
from sgl_blend.launch.supervisor import ServerProcess

SERVER = "server"


def launch(model: str, log_dir: Path, *sglang_args: str) -> ServerProcess:
    """Start a real server on a free port, logging to a file the failure message points at."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return supervisor.start_server(model, ["--port", str(free_port()), *sglang_args],
                                   log_path=log_dir / f"{model}-server.log")


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = launch("tiny-llama", tmp_path_factory.mktemp("tiny-server"), "--enable-cache-report")
    yield server
    server.stop()


_running: pytest.Item | None = None
_start_server = supervisor.start_server


def _start_server_in_a_server_test(*args: Any, **kwargs: Any) -> ServerProcess:
    if _running is not None and _running.get_closest_marker(SERVER) is None:
        pytest.fail(f"{_running.nodeid} starts a real server but is not marked `{SERVER}` (mark the test, or its "
                    "module's pytestmark, with pytest.mark.server)")
    return _start_server(*args, **kwargs)


# Test modules import `start_server` after this conftest, so they get the checked one.
supervisor.start_server = _start_server_in_a_server_test


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _running
    _running = item


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    global _running
    _running = None
