"""The store's database: a SQLAlchemy engine on SQLite or PostgreSQL, and its transactions.

Every store call checks a connection out of the engine's pool for one transaction and gives it
back, so no caller waits behind another's connection: API reads and the runner's commits go on
side by side (a PostgreSQL row lock or SQLite's one writer orders only what must be ordered).

PostgreSQL is for several servers sharing one store. Its connections are checked before use
(``pool_pre_ping``), so a store that restarted costs one reconnect, not an error; they carry a
connect timeout, TCP keepalives and a user timeout, so a half-open socket fails in seconds instead
of hanging a worker thread; and statement, lock and idle-in-transaction timeouts, so neither a
slow query nor a stalled holder of a row lock (a coordinator stopped mid-transaction) blocks the
others for long. A URL may set any of these itself.

SQLite is for one server: its database file lives in the data directory, whose lock file (an
flock, which a killed process gives up at once) a second server cannot take. It runs in WAL mode
with ``synchronous=FULL``, so a committed line survives power loss too; a write transaction
begins ``IMMEDIATE`` (it takes the write lock up front, so it never fails half way when another
writer got there first), a read transaction is deferred and reads a snapshot beside the writer.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

SQLITE_FILE = "batches.sqlite3"
LOCK_FILE = "server.lock"
SQLITE_BUSY_S = 30.0
# Connections one store holds at most: the API's worker threads and the runner's share them.
POOL_SIZE, POOL_OVERFLOW, POOL_WAIT_S, POOL_RECYCLE_S = 8, 8, 30.0, 1800.0
# libpq settings a URL does not give itself: seconds to connect, TCP keepalives, a user timeout
# (ms) for sent data never acknowledged, and the server-side limits on one statement, one lock
# wait and a transaction left idle (ms).
POSTGRES_CONNECT_ARGS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,
}
POSTGRES_SESSION = {"statement_timeout": 60_000, "lock_timeout": 30_000, "idle_in_transaction_session_timeout": 15_000}
# How long a read that lost its connection is tried again (a PostgreSQL restart takes seconds).
READ_RETRY_S = 30.0
_WRITE = "sgl_blend_write"
T = TypeVar("T")


class StoreInUse(RuntimeError):
    """Another server already serves this data directory with its SQLite store."""


def connection_lost(error: BaseException) -> bool:
    """Whether ``error`` is the database's operational trouble (unreachable, a dropped connection,
    a lock or statement timeout, a full disk) rather than a refused statement: worth trying again."""
    return isinstance(error, OperationalError) or (isinstance(error, DBAPIError) and error.connection_invalidated)


def retry_reads(read: Callable[..., T]) -> Callable[..., T]:
    """Run a read-only store call again when its connection was lost: a read changes nothing,
    so trying again is always safe (a write is not: it may have landed)."""
    return retry(
        retry=retry_if_exception(connection_lost),
        stop=stop_after_delay(READ_RETRY_S),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        reraise=True,
    )(read)


class Database:
    def __init__(self, engine: Engine, lock_descriptor: int | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._lock_descriptor = lock_descriptor

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One atomic write: committed on normal exit, rolled back on an exception."""
        with self.engine.connect() as connection:
            connection.execution_options(**{_WRITE: True})
            with connection.begin():
                yield connection

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """One consistent read (a snapshot on SQLite, beside any writer)."""
        with self.engine.connect() as connection, connection.begin():
            yield connection

    def close(self) -> None:
        """Close every pooled connection and give up the data directory's lock (SQLite)."""
        self.engine.dispose()
        if self._lock_descriptor is not None:
            os.close(self._lock_descriptor)
            self._lock_descriptor = None


def open_database(store_url: str, data_dir: Path, *, lock: bool = True) -> Database:
    """``store_url``: empty for SQLite in ``data_dir``, or a ``postgresql://`` URL. ``lock=False``
    opens a SQLite store beside the server that holds its data directory (`sgl-blend run-batch`
    following its job's progress), which must only read it."""
    if store_url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        return Database(_postgres_engine(store_url))
    if store_url:
        raise ValueError(f"--batch-store takes a postgresql:// URL (or nothing for SQLite), not {store_url!r}")
    data_dir.mkdir(parents=True, exist_ok=True)
    if not lock:
        return Database(_sqlite_engine(data_dir / SQLITE_FILE))
    lock_descriptor = _lock_data_dir(data_dir)
    try:
        return Database(_sqlite_engine(data_dir / SQLITE_FILE), lock_descriptor)
    except BaseException:
        os.close(lock_descriptor)
        raise


def _postgres_engine(store_url: str) -> Engine:
    url = make_url(store_url).set(drivername="postgresql+psycopg")
    connect_args: dict[str, Any] = {key: value for key, value in POSTGRES_CONNECT_ARGS.items() if key not in url.query}
    if "options" not in url.query:
        connect_args["options"] = " ".join(f"-c {name}={value}" for name, value in POSTGRES_SESSION.items())
    return create_engine(
        url,
        connect_args=connect_args,
        pool_pre_ping=True,
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        pool_timeout=POOL_WAIT_S,
        pool_recycle=POOL_RECYCLE_S,
    )


def _sqlite_engine(path: Path) -> Engine:
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_S},
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        pool_timeout=POOL_WAIT_S,
    )

    @event.listens_for(engine, "connect")
    def configure(dbapi_connection: Any, _record: Any) -> None:
        # The driver's own transaction handling off: `begin` below says how each one starts.
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed line survives power loss too, not only a killed process.
        dbapi_connection.execute("PRAGMA synchronous=FULL")
        dbapi_connection.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_S * 1000)}")

    @event.listens_for(engine, "begin")
    def begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(_WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def _lock_data_dir(data_dir: Path) -> int:
    """Take the data directory's lock (an flock, which a killed process gives up at once)."""
    descriptor = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise StoreInUse(
            f"another sgl-blend server uses the batch data directory {data_dir}; "
            "give this one its own --data-dir, or share a PostgreSQL --batch-store"
        ) from None
    return descriptor
