"""Session-wide fixtures: one real tiny-llama SGLang server for every test that needs one."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest

from sgl_blend.launch.supervisor import ServerProcess, start_server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(model: str, log_dir: Path, *sglang_args: str) -> ServerProcess:
    """Start a real server on a free port, logging to a file the failure message points at."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return start_server(model, ["--port", str(free_port()), *sglang_args],
                        log_path=log_dir / f"{model}-server.log")


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = launch("tiny-llama", tmp_path_factory.mktemp("tiny-server"), "--enable-cache-report")
    yield server
    server.stop()
