"""One SQL connection to SQLite or PostgreSQL, behind the few calls the store needs.

The store writes its SQL once, with ``?`` placeholders and the ``{id_column}`` / ``{float}`` type
tokens, and this module adapts it to the dialect. A connection is shared by the event loop's
worker threads, so every transaction holds a lock.

SQLite is for one server: its database file lives in the data directory, whose lock file a
second server cannot take. PostgreSQL is for several servers sharing one store.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

SQLITE_FILE = "batches.sqlite3"
LOCK_FILE = "server.lock"
_TYPE_TOKENS = {
    "sqlite": {"id_column": "INTEGER PRIMARY KEY AUTOINCREMENT", "float": "DOUBLE PRECISION"},
    "postgresql": {"id_column": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "float": "DOUBLE PRECISION"},
}


class StoreInUse(RuntimeError):
    """Another server already serves this data directory with its SQLite store."""


class Transaction:
    def __init__(self, cursor: Any, dialect: str) -> None:
        self._cursor = cursor
        self._dialect = dialect

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self._dialect == "postgresql" else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run one statement; the rows it returns (if any) as dicts."""
        self._cursor.execute(self._sql(sql), tuple(params))
        if self._cursor.description is None:
            return []
        names = [column[0] for column in self._cursor.description]
        return [dict(zip(names, row)) for row in self._cursor.fetchall()]

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._cursor.executemany(self._sql(sql), [tuple(row) for row in rows])

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount


class Database:
    def __init__(self, dialect: str, connect: Any, lock_descriptor: int | None = None) -> None:
        self.dialect = dialect
        self._connect = connect
        self._connection = connect()
        self._lock = threading.RLock()
        self._lock_descriptor = lock_descriptor

    def ddl(self, sql: str) -> str:
        return sql.format(**_TYPE_TOKENS[self.dialect])

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """One atomic unit: committed on normal exit, rolled back on an exception."""
        with self._lock:
            if self.dialect == "sqlite":
                cursor = self._connection.cursor()
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    yield Transaction(cursor, self.dialect)
                except BaseException:
                    self._connection.rollback()
                    raise
                self._connection.commit()
            else:
                if self._connection.closed:
                    self._connection = self._connect()
                with self._connection.transaction(), self._connection.cursor() as cursor:
                    yield Transaction(cursor, self.dialect)

    def close(self) -> None:
        """Close the connection and give up the data directory's lock (SQLite)."""
        with self._lock:
            self._connection.close()
            if self._lock_descriptor is not None:
                os.close(self._lock_descriptor)
                self._lock_descriptor = None


def open_database(store_url: str, data_dir: Path) -> Database:
    """``store_url``: empty for SQLite in ``data_dir``, or a ``postgresql://`` URL."""
    if store_url.startswith(("postgresql://", "postgres://")):
        import psycopg

        return Database("postgresql", lambda: psycopg.connect(store_url))
    if store_url:
        raise ValueError(f"--batch-store takes a postgresql:// URL (or nothing for SQLite), not {store_url!r}")
    data_dir.mkdir(parents=True, exist_ok=True)
    lock_descriptor = _lock_data_dir(data_dir)

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(data_dir / SQLITE_FILE, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed line survives power loss too, not only a killed process.
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("PRAGMA busy_timeout=30000")
        return connection

    try:
        return Database("sqlite", connect, lock_descriptor)
    except BaseException:
        os.close(lock_descriptor)
        raise


def _lock_data_dir(data_dir: Path) -> int:
    """Take the data directory's lock (an flock, which a killed process gives up at once)."""
    descriptor = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise StoreInUse(f"another sgl-blend server uses the batch data directory {data_dir}; "
                         "give this one its own --data-dir, or share a PostgreSQL --batch-store") from None
    return descriptor
