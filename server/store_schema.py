"""The store's tables, created on first open, and the columns later versions added to them."""

from __future__ import annotations

from sgl_blend.server.db import Database

_TABLES = (
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
        lease_until {float} NOT NULL DEFAULT 0
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
        dp_rank BIGINT,
        plan_rank BIGINT,
        placement TEXT,
        PRIMARY KEY (batch_id, line_number)
    )""",
)
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS batch_lines_todo ON batch_lines (batch_id, state, worker, dp_rank, line_number)",
    "CREATE INDEX IF NOT EXISTS batches_active ON batches (status, lease_until)",
)
# Columns a store made by an earlier version lacks: NULL in its lines (a DP rank: any rank; a plan
# rank: not planned yet).
_ADDED_LINE_COLUMNS = (("dp_rank", "BIGINT"), ("plan_rank", "BIGINT"), ("placement", "TEXT"))


def create_schema(db: Database) -> None:
    """Create what is missing: the tables, the columns added since, then the indexes (which name
    those columns)."""
    with db.transaction() as tx:
        for statement in _TABLES:
            tx.execute(db.ddl(statement))
    for column, kind in _ADDED_LINE_COLUMNS:
        _add_line_column(db, column, kind)
    with db.transaction() as tx:
        for statement in _INDEXES:
            tx.execute(db.ddl(statement))


def _add_line_column(db: Database, column: str, kind: str) -> None:
    try:
        with db.transaction() as tx:
            tx.execute(f"SELECT {column} FROM batch_lines WHERE 1 = 0")
    except Exception:
        with db.transaction() as tx:
            tx.execute("DROP INDEX IF EXISTS batch_lines_todo")
            tx.execute(f"ALTER TABLE batch_lines ADD COLUMN {column} {kind}")
