"""Fixtures of the Batch API tests: a real PostgreSQL server started in a temporary directory, one
shared tiny-llama server with an API key and small file and line limits (so the 413,
too-many-lines and line-too-long cases are cheap), and the official `openai` client on it.

The shared server keeps its batch store in that PostgreSQL, so the API tests run end to end on the
multi-server backend; the kill-and-restart test and the runner test use the default SQLite store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import openai
import psycopg
import pytest

from sgl_blend.server.config import BatchApiConfig
from sgl_blend.launch.supervisor import ServerProcess, start_server
from tests.conftest import free_port

API_KEY = "sk-batch-test"
MAX_FILE_BYTES = 1024 * 1024
MAX_FILE_LINES = 400
MAX_LINE_BYTES = 256 * 1024
POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")


def start_batch_server(work_dir: Path, data_dir: Path, store_url: str = "") -> ServerProcess:
    work_dir.mkdir(parents=True, exist_ok=True)
    config = BatchApiConfig(data_dir=data_dir, store_url=store_url, max_file_bytes=MAX_FILE_BYTES,
                            max_file_lines=MAX_FILE_LINES, max_line_bytes=MAX_LINE_BYTES)
    return start_server("tiny-llama", ["--port", str(free_port()), "--api-key", API_KEY, "--enable-cache-report"],
                        log_path=work_dir / "server.log", batch_api=config)


def new_database(admin_url: str, name: str) -> str:
    """A fresh, empty database on the test PostgreSQL; its URL."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return admin_url.rsplit("/", 1)[0] + "/" + name


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
    """A real PostgreSQL 15 in a temporary directory. Its binaries come with the machine image
    (Debian's postgresql-15); their absence fails the tests loudly rather than skipping them."""
    if not (POSTGRES_BIN / "initdb").exists():
        pytest.fail(f"PostgreSQL server binaries not found in {POSTGRES_BIN}: install Debian's postgresql-15")
    root = Path(tempfile.mkdtemp(prefix="sgl-blend-pg-"))
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        shutil.chown(root, user="postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()

    def pg(*args: str) -> None:
        subprocess.run([*as_postgres, *args], check=True, capture_output=True, cwd=root)

    pg(str(POSTGRES_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
    pg(str(POSTGRES_BIN / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "start", "-o",
       f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        pg(str(POSTGRES_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)
