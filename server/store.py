"""Files, batches and batch lines, durably, in SQLite or PostgreSQL.

A batch is never held whole anywhere: its input is indexed into one row per line (line number,
custom_id, byte offset and length in the input file, state), and its results are appended to two
files on disk whose *committed* lengths live in the batch's row. A result counts only once the
transaction that marks its line done and moves the committed length past it has committed, so on
restart every file is cut back to its committed length and every line not marked done runs again:
a hard kill at any instant loses no line and duplicates none.

Several runners may share one PostgreSQL store. Each batch has one coordinator at a time (``owner``
with a ``lease_until`` it keeps renewing), because its result files must have a single writer for
the committed-length scheme to hold; every write a coordinator makes is fenced on still owning the
lease. A coordinator may still spread a batch's lines over several servers: each line records the
``worker`` it is assigned to, and the DP rank inside it (``dp_rank``, NULL when the server's own
DP controller chooses).

`BatchStore` is files and batches here, and a batch's lines in `store_lines`; the rows it takes and
returns are in `store_rows` and the tables in `store_schema`. Everything is importable from here.
"""

from __future__ import annotations

import json
from typing import Any

from sgl_blend.server.db import Database, open_database
from sgl_blend.server.store_lines import LineQueries, fence
from sgl_blend.server.store_rows import (ACTIVE_STATUSES, COMPLETED, FAILED, PENDING, TERMINAL_STATUSES,
                                         AlreadyCommitted, BatchCommit, BatchRow, Conflict, FileRow, LeaseLost,
                                         LineRow, batch_row, file_row, marks)
from sgl_blend.server.store_schema import create_schema

__all__ = [
    "ACTIVE_STATUSES", "COMPLETED", "FAILED", "PENDING", "TERMINAL_STATUSES", "AlreadyCommitted", "BatchCommit",
    "BatchRow", "BatchStore", "Conflict", "FileRow", "LeaseLost", "LineRow",
]

_FINISHED_FROM = {"completed": "finalizing", "expired": "in_progress", "cancelled": "cancelling"}


class BatchStore(LineQueries):
    def __init__(self, db: Database) -> None:
        self.db = db
        create_schema(db)

    @classmethod
    def open(cls, store_url: str, data_dir: Any) -> BatchStore:
        return cls(open_database(store_url, data_dir))

    @property
    def exclusive(self) -> bool:
        """True when no other server can share this store (SQLite under the data directory's lock)."""
        return self.db.dialect == "sqlite"

    def close(self) -> None:
        self.db.close()

    # Files

    def add_file(self, row: FileRow) -> None:
        with self.db.transaction() as tx:
            _insert_file(tx, row)

    def get_file(self, file_id: str) -> FileRow | None:
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT * FROM files WHERE id = ?", (file_id,))
        return file_row(rows[0]) if rows else None

    def list_files(self, *, after: str | None, limit: int, order: str = "desc",
                   purpose: str | None = None) -> tuple[list[FileRow], bool]:
        """One page in ``created`` order (newest first for ``desc``) and whether more follow."""
        rows, more = self._page("files", after=after, limit=limit, descending=order == "desc",
                                where=("purpose = ?", (purpose,)) if purpose else None)
        return [file_row(row) for row in rows], more

    def delete_file(self, file_id: str) -> FileRow | None:
        """Remove a file's row (None if there is none); refuse while an unfinished batch reads it."""
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT * FROM files WHERE id = ?", (file_id,))
            if not rows:
                return None
            users = tx.execute(
                f"SELECT id FROM batches WHERE input_file_id = ? AND status IN ({marks(ACTIVE_STATUSES)})",
                (file_id, *ACTIVE_STATUSES))
            if users:
                raise Conflict(f"file {file_id} is the input of batch {users[0]['id']}, which has not finished")
            tx.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return file_row(rows[0])

    def expired_files(self, now: int) -> list[FileRow]:
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT * FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,))
        return [file_row(row) for row in rows]

    # Batches as the API sees them

    def add_batch(self, row: BatchRow) -> None:
        """A new batch; it starts coordinated by ``row.owner`` until ``row.lease_until`` when it has
        one (the routes create batches that no runner holds yet)."""
        with self.db.transaction() as tx:
            tx.execute(
                "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, created_at, expires_at,"
                " metadata, output_expires_after, output_blob, error_blob, owner, lease_until)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row.id, row.endpoint, row.input_file_id, row.completion_window, row.status, row.created_at,
                 row.expires_at, json.dumps(row.metadata) if row.metadata is not None else None,
                 row.output_expires_after, row.output_blob, row.error_blob, row.owner, row.lease_until))

    def get_batch(self, batch_id: str) -> BatchRow | None:
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return batch_row(rows[0]) if rows else None

    def list_batches(self, *, after: str | None, limit: int) -> tuple[list[BatchRow], bool]:
        rows, more = self._page("batches", after=after, limit=limit, descending=True)
        return [batch_row(row) for row in rows], more

    def request_cancel(self, batch_id: str, now: int) -> BatchRow | None:
        """``validating``/``in_progress`` become ``cancelling``; a cancel already under way is a no-op."""
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT status FROM batches WHERE id = ?", (batch_id,))
            if not rows:
                return None
            status = rows[0]["status"]
            if status in ("validating", "in_progress"):
                tx.execute("UPDATE batches SET status = 'cancelling', cancelling_at = ? WHERE id = ?", (now, batch_id))
            elif status != "cancelling":
                raise Conflict(f"batch {batch_id} is {status}; only a validating or in-progress batch can be cancelled")
        return self.get_batch(batch_id)

    # Batches as a runner coordinates them (their lines: `LineQueries`)

    def claim_batches(self, owner: str, now: float, lease_s: float, *, steal: bool = False) -> list[BatchRow]:
        """Take (or renew) the lease of every unfinished batch that is free, lapsed, or already ours;
        ``steal`` takes them all (a sole server starting up)."""
        with self.db.transaction() as tx:
            condition = "" if steal else " AND (owner IS NULL OR owner = ? OR lease_until < ?)"
            params: tuple = (owner, now + lease_s, *ACTIVE_STATUSES) + (() if steal else (owner, now))
            tx.execute(f"UPDATE batches SET owner = ?, lease_until = ? WHERE status IN ({marks(ACTIVE_STATUSES)})"
                       + condition, params)
            rows = tx.execute(f"SELECT * FROM batches WHERE owner = ? AND status IN ({marks(ACTIVE_STATUSES)})"
                              " ORDER BY seq", (owner, *ACTIVE_STATUSES))
        return [batch_row(row) for row in rows]

    def release(self, owner: str) -> None:
        """Let go of every lease at a clean shutdown, so another runner need not wait for it to lapse."""
        with self.db.transaction() as tx:
            tx.execute("UPDATE batches SET lease_until = 0 WHERE owner = ?", (owner,))

    def fail_batch(self, batch_id: str, owner: str, errors: list[dict[str, Any]], now: int) -> None:
        with self.db.transaction() as tx:
            fence(tx, batch_id, owner)
            tx.execute("UPDATE batches SET status = 'failed', failed_at = ?, errors = ? WHERE id = ?",
                       (now, json.dumps(errors), batch_id))

    def set_finalizing(self, batch_id: str, owner: str, now: int) -> None:
        with self.db.transaction() as tx:
            fence(tx, batch_id, owner)
            tx.execute("UPDATE batches SET status = 'finalizing', finalizing_at = ? WHERE id = ? AND status = 'in_progress'",
                       (now, batch_id))

    def finish(self, batch_id: str, owner: str, status: str, now: int,
               output_file: FileRow | None, error_file: FileRow | None) -> bool:
        """End a batch as ``completed`` (from ``finalizing``), ``expired`` (from ``in_progress``) or
        ``cancelled`` (from ``cancelling``), publishing its result files. False, changing nothing, when
        the batch is no longer in that state (a cancel came in meanwhile)."""
        with self.db.transaction() as tx:
            fence(tx, batch_id, owner)
            tx.execute(f"UPDATE batches SET status = ?, {status}_at = ?, output_file_id = ?, error_file_id = ?,"
                       " owner = NULL, lease_until = 0 WHERE id = ? AND status = ?",
                       (status, now, output_file.id if output_file else None, error_file.id if error_file else None,
                        batch_id, _FINISHED_FROM[status]))
            if tx.rowcount != 1:
                return False
            for row in (output_file, error_file):
                if row is not None:
                    _insert_file(tx, row)
        return True

    # Helpers

    def _page(self, table: str, *, after: str | None, limit: int, descending: bool,
              where: tuple[str, tuple] | None = None) -> tuple[list[dict[str, Any]], bool]:
        clauses, params = [], []
        if where:
            clauses.append(where[0])
            params.extend(where[1])
        with self.db.transaction() as tx:
            if after is not None:
                anchor = tx.execute(f"SELECT seq FROM {table} WHERE id = ?", (after,))
                if not anchor:
                    raise KeyError(after)
                clauses.append("seq < ?" if descending else "seq > ?")
                params.append(anchor[0]["seq"])
            sql = f"SELECT * FROM {table}" + (" WHERE " + " AND ".join(clauses) if clauses else "")
            sql += f" ORDER BY seq {'DESC' if descending else 'ASC'} LIMIT ?"
            rows = tx.execute(sql, (*params, limit + 1))
        return rows[:limit], len(rows) > limit


def _insert_file(tx: Any, row: FileRow) -> None:
    tx.execute("INSERT INTO files (id, purpose, filename, bytes, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
               (row.id, row.purpose, row.filename, row.bytes, row.created_at, row.expires_at))
