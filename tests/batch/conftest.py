"""Fixtures of the Batch API tests: a real PostgreSQL server (`tests.batch.postgres`), one
shared tiny-llama server with an API key and small file and line limits (so the 413,
too-many-lines and line-too-long cases are cheap), and the official `openai` client on it.

The shared server keeps its batch store in that PostgreSQL, so the API tests run end to end on the
multi-server backend; the kill-and-restart test and the runner test use the default SQLite store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import openai
import pytest

from sgl_blend.server.config import BatchApiConfig
from sgl_blend.launch.supervisor import ServerProcess, start_server
from tests.batch.postgres import new_database, start_postgres
from tests.conftest import free_port

API_KEY = "sk-batch-test"
MAX_FILE_BYTES = 1024 * 1024
MAX_FILE_LINES = 400
MAX_LINE_BYTES = 256 * 1024


def start_batch_server(work_dir: Path, data_dir: Path, store_url: str = "") -> ServerProcess:
    work_dir.mkdir(parents=True, exist_ok=True)
    config = BatchApiConfig(data_dir=data_dir, store_url=store_url, max_file_bytes=MAX_FILE_BYTES,
                            max_file_lines=MAX_FILE_LINES, max_line_bytes=MAX_LINE_BYTES)
    return start_server("tiny-llama", ["--port", str(free_port()), "--api-key", API_KEY, "--enable-cache-report"],
                        log_path=work_dir / "server.log", batch_api=config)


def client_for(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="session")
def batch_work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared server's log and, under ``data``, its file contents."""
    return tmp_path_factory.mktemp("batch-server")


@pytest.fixture(scope="session")
def batch_store_url(postgres_url: str) -> str:
    """The shared server's store, for tests that read it or run a runner of their own on it."""
    return new_database(postgres_url, "batch_server")


@pytest.fixture(scope="session")
def batch_server(batch_work_dir: Path, batch_store_url: str) -> Iterator[ServerProcess]:
    server = start_batch_server(batch_work_dir, batch_work_dir / "data", batch_store_url)
    yield server
    server.stop()


@pytest.fixture()
def client(batch_server: ServerProcess) -> openai.OpenAI:
    return client_for(batch_server)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The shared test PostgreSQL's admin URL (`new_database` makes a database on it)."""
    server = start_postgres()
    try:
        yield server.url
    finally:
        server.stop()
