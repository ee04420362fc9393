"""A real PostgreSQL for the tests, run by pytest-postgresql's executor in a temporary directory.

PostgreSQL refuses to run as root, which CI is: then every pg_ctl call goes through a two-line
wrapper that runs it as the ``postgres`` user (Debian's postgresql package makes that user), in a
directory that user owns. The server binaries come with the machine image; their absence fails
the tests loudly rather than skipping them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg
from pytest_postgresql.executors import PostgreSQLExecutor

from tests.conftest import free_port


@dataclass
class PostgresServer:
    executor: PostgreSQLExecutor
    root: Path

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.executor.port}/postgres"

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate``: every backend killed at once, no checkpoint, then
        recovery from the WAL -- as after a crash of the database server. The new server writes to
        the log file (its output on a pipe would keep `subprocess.run` waiting for the pipe to close)."""
        subprocess.run([self.executor.executable, "restart", "-D", self.executor.datadir, "-m", "immediate", "-w",
                        "-l", self.executor.logfile], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self.executor.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> PostgresServer:
    root = Path(tempfile.mkdtemp(prefix="sgl-blend-pg-"))
    pg_ctl = _pg_ctl()
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres")
        wrapper = root / "pg_ctl"
        wrapper.write_text(f'#!/bin/sh\nexec runuser -u postgres -- {shlex.quote(pg_ctl)} "$@"\n')
        wrapper.chmod(0o755)
        pg_ctl = str(wrapper)
    executor = _AnsweringPostgres(executable=pg_ctl, host="127.0.0.1", port=free_port(), datadir=str(root / "data"),
                                  unixsocketdir=str(root), logfile=str(root / "log"), startparams="-w",
                                  dbname="postgres", postgres_options="-c max_connections=300")
    executor.start()
    return PostgresServer(executor, root)


class _AnsweringPostgres(PostgreSQLExecutor):
    """Started once it answers a connection: its TCP port, which mirakuru's executor waits for,
    opens while the server still says "the database system is starting up" (seen on a loaded
    2-core host)."""

    def after_start_check(self) -> bool:
        try:
            with psycopg.connect(host=self.host, port=self.port, user=self.user, dbname="postgres", connect_timeout=5):
                return True
        except psycopg.OperationalError:
            return False


def new_database(admin_url: str, name: str) -> str:
    """A fresh, empty database on a test PostgreSQL; its URL."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return admin_url.rsplit("/", 1)[0] + "/" + name


def _pg_ctl() -> str:
    try:
        bindir = subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        bindir = ""
    found = Path(bindir) / "pg_ctl" if bindir else None
    if found is not None and found.exists():
        return str(found)
    on_path = shutil.which("pg_ctl")
    if on_path is None:
        raise RuntimeError("PostgreSQL's server binaries (pg_ctl) are not installed: install Debian's postgresql-15")
    return on_path
