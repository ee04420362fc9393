"""The store's tables, and the ordered migrations that make them.

`MIGRATIONS` is the schema's history: each step moves a store from one version to the next, and
the version a store has reached is recorded in its ``schema_version`` table, so opening a store
runs exactly the steps it lacks, in order, in one transaction (several servers opening one
PostgreSQL store at once take turns on an advisory lock). A step never changes after it shipped:
a new column is a new step. The steps that add columns check for them first, because stores made
before the version table existed carry some of them already.

The `Table` objects describe the schema at the newest version, for the store's queries.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Float,
    Integer,
    MetaData,
    Table,
    Text,
    inspect,
    select,
    text,
    update,
)

from sgl_blend.server.db import Database

metadata = MetaData()
_ID = BigInteger().with_variant(Integer, "sqlite")

files = Table(
    "files",
    metadata,
    Column("seq", _ID, primary_key=True),
    Column("id", Text, nullable=False, unique=True),
    Column("purpose", Text, nullable=False),
    Column("filename", Text, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger),
    Column("created_by", Text),
)

batches = Table(
    "batches",
    metadata,
    Column("seq", _ID, primary_key=True),
    Column("id", Text, nullable=False, unique=True),
    Column("endpoint", Text, nullable=False),
    Column("input_file_id", Text, nullable=False),
    Column("completion_window", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    *(
        Column(f"{status}_at", BigInteger)
        for status in ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
    ),
    Column("errors", Text),
    Column("metadata", Text),
    Column("output_expires_after", BigInteger),
    *(
        Column(counter, BigInteger, nullable=False, default=0)
        for counter in ("total", "completed", "failed", "input_tokens", "cached_tokens", "output_tokens")
    ),
    Column("output_blob", Text, nullable=False),
    Column("error_blob", Text, nullable=False),
    Column("output_bytes", BigInteger, nullable=False, default=0),
    Column("error_bytes", BigInteger, nullable=False, default=0),
    Column("output_file_id", Text),
    Column("error_file_id", Text),
    Column("owner", Text),
    Column("lease_until", Float, nullable=False, default=0.0),
    Column("created_by", Text),
)

batch_lines = Table(
    "batch_lines",
    metadata,
    Column("batch_id", Text, primary_key=True),
    Column("line_number", BigInteger, primary_key=True),
    Column("custom_id", Text),
    Column("byte_offset", BigInteger, nullable=False),
    Column("byte_length", BigInteger, nullable=False),
    Column("state", Text, nullable=False),
    Column("error_code", Text),
    Column("error_message", Text),
    Column("worker", Text),
    Column("dp_rank", BigInteger),
    Column("plan_rank", BigInteger),
    Column("placement", Text),
)

schema_version = Table("schema_version", metadata, Column("version", Integer, nullable=False))

# The first release's tables, as it wrote them.
_FIRST_TABLES = (
    """CREATE TABLE IF NOT EXISTS files (
        seq {id_column},
        id TEXT NOT NULL UNIQUE,
        purpose TEXT NOT NULL,
        filename TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT
    )""",
    """CREATE TABLE IF NOT EXISTS batches (
        seq {id_column},
        id TEXT NOT NULL UNIQUE,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        in_progress_at BIGINT, finalizing_at BIGINT, completed_at BIGINT, failed_at BIGINT,
        expired_at BIGINT, cancelling_at BIGINT, cancelled_at BIGINT,
        errors TEXT,
        metadata TEXT,
        output_expires_after BIGINT,
        total BIGINT NOT NULL DEFAULT 0,
        completed BIGINT NOT NULL DEFAULT 0,
        failed BIGINT NOT NULL DEFAULT 0,
        input_tokens BIGINT NOT NULL DEFAULT 0,
        cached_tokens BIGINT NOT NULL DEFAULT 0,
        output_tokens BIGINT NOT NULL DEFAULT 0,
        output_blob TEXT NOT NULL,
        error_blob TEXT NOT NULL,
        output_bytes BIGINT NOT NULL DEFAULT 0,
        error_bytes BIGINT NOT NULL DEFAULT 0,
        output_file_id TEXT,
        error_file_id TEXT,
        owner TEXT,
        lease_until DOUBLE PRECISION NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE IF NOT EXISTS batch_lines (
        batch_id TEXT NOT NULL,
        line_number BIGINT NOT NULL,
        custom_id TEXT,
        byte_offset BIGINT NOT NULL,
        byte_length BIGINT NOT NULL,
        state TEXT NOT NULL,
        error_code TEXT,
        error_message TEXT,
        worker TEXT,
        PRIMARY KEY (batch_id, line_number)
    )""",
    "CREATE INDEX IF NOT EXISTS batches_active ON batches (status, lease_until)",
)
_ID_COLUMN = {
    "sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT",
    "postgresql": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
}
# Any number: the key of the advisory lock that makes PostgreSQL migrations take turns.
_MIGRATION_LOCK = 0x5B1E4D


def _create_first_tables(connection: Connection) -> None:
    for statement in _FIRST_TABLES:
        connection.exec_driver_sql(statement.format(id_column=_ID_COLUMN[connection.dialect.name]))


def _add_placement_columns(connection: Connection) -> None:
    """Where a line runs inside a worker and its place in the global plan (NULL in older lines:
    any DP rank, not planned yet)."""
    _add_columns(connection, "batch_lines", (("dp_rank", "BIGINT"), ("plan_rank", "BIGINT"), ("placement", "TEXT")))


def _add_creators(connection: Connection) -> None:
    """The identity of the API key that created each file and batch (NULL: visible to admins only)."""
    _add_columns(connection, "files", (("created_by", "TEXT"),))
    _add_columns(connection, "batches", (("created_by", "TEXT"),))


def _index_feeds(connection: Connection) -> None:
    """Indexes that serve a slot's feed read in file order and in plan order, so that a refill
    reads one index range instead of sorting every pending line of the batch."""
    connection.exec_driver_sql("DROP INDEX IF EXISTS batch_lines_todo")
    connection.exec_driver_sql(
        "CREATE INDEX batch_lines_todo ON batch_lines (batch_id, state, worker, dp_rank, line_number)"
    )
    connection.exec_driver_sql(
        "CREATE INDEX batch_lines_plan ON batch_lines (batch_id, state, worker, dp_rank, plan_rank, line_number)"
    )


MIGRATIONS: tuple[Callable[[Connection], None], ...] = (
    _create_first_tables,
    _add_placement_columns,
    _add_creators,
    _index_feeds,
)


def migrate(db: Database) -> int:
    """Bring the store to the newest version; the version it had before."""
    with db.transaction() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            connection.exec_driver_sql("SET LOCAL statement_timeout = 0")
        schema_version.create(connection, checkfirst=True)
        found = connection.execute(select(schema_version.c.version)).scalar()
        if found is None:
            connection.execute(schema_version.insert().values(version=0))
        before = found or 0
        for step in MIGRATIONS[before:]:
            step(connection)
        if before < len(MIGRATIONS):
            connection.execute(update(schema_version).values(version=len(MIGRATIONS)))
    return before


def _add_columns(connection: Connection, table: str, columns: tuple[tuple[str, str], ...]) -> None:
    present = {column["name"] for column in inspect(connection).get_columns(table)}
    for name, kind in columns:
        if name not in present:
            connection.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
