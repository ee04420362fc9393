"""Files, batches and batch lines, durably, in SQLite or PostgreSQL (SQLAlchemy Core, `server.db`).

A batch is never kept whole anywhere: its input is indexed into one row per line (line number,
custom_id, byte offset and length in the input file, state), and its results are appended to two
files on disk whose *committed* lengths live in the batch's row. A result counts only once the
transaction that marks its line done and moves the committed length past it has committed, so on
restart every file is cut back to its committed length and every line not marked done runs again:
a hard kill at any instant loses no line and duplicates none.

Several runners may share one PostgreSQL store. Each batch has one coordinator at a time (``owner``
with a ``lease_until`` it keeps renewing), because its result files must have a single writer for
the committed-length scheme to hold; every write a coordinator makes is fenced on still owning the
lease, with the batch's row locked until the write commits (`store_lines.fence`). A coordinator may
still spread a batch's lines over several servers: each line records the ``worker`` it is assigned
to, and the DP rank inside it (``dp_rank``, NULL when the server's own DP controller chooses).

Ownership by API key: a file or batch records who created it (``created_by``: `key_owner` of the
creating key, a hash, never the key). The methods the routes call -- `add_file`, `add_batch`,
`get_file`, `get_batch`, `list_files`, `list_batches`, `delete_file`, `request_cancel` -- take
``owner``: on the two ``add_`` methods the creator to record, elsewhere a filter under which
another owner's object does not exist (None, or NULL in the store, when no key created it). A
filter of None is an admin's view: everything. A batch's result files are published with its
creator. (``owner`` on the runner's methods -- `claim_batches`, `commit_results`, ... -- is the
coordinating runner, which ``BatchRow.owner`` holds.)

`BatchStore` is files and batches here, and a batch's lines in `store_lines`; the rows it takes and
returns are in `store_rows` and the tables and their migrations in `store_schema`. Everything is
importable from here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, RowMapping, Select, Table, or_, select, update

from sgl_blend.server.db import Database, open_database, retry_reads
from sgl_blend.server.store_lines import LineQueries, fence
from sgl_blend.server.store_rows import (
    ACTIVE_STATUSES,
    COMPLETED,
    FAILED,
    PENDING,
    TERMINAL_STATUSES,
    AlreadyCommitted,
    BatchCommit,
    BatchRow,
    Conflict,
    FileRow,
    LeaseLost,
    LineRow,
    batch_row,
    file_row,
    key_owner,
)
from sgl_blend.server.store_schema import batches, files, migrate

__all__ = [
    "ACTIVE_STATUSES",
    "COMPLETED",
    "FAILED",
    "PENDING",
    "TERMINAL_STATUSES",
    "AlreadyCommitted",
    "BatchCommit",
    "BatchRow",
    "BatchStore",
    "Conflict",
    "FileRow",
    "LeaseLost",
    "LineRow",
    "key_owner",
]

_FINISHED_FROM = {"completed": "finalizing", "expired": "in_progress", "cancelled": "cancelling"}


class BatchStore(LineQueries):
    def __init__(self, db: Database) -> None:
        self.db = db
        migrate(db)

    @classmethod
    def open(cls, store_url: str, data_dir: Any, *, lock: bool = True) -> BatchStore:
        """``lock``: see `server.db.open_database`."""
        db = open_database(store_url, data_dir, lock=lock)
        try:
            return cls(db)
        except BaseException:
            db.close()
            raise

    @property
    def exclusive(self) -> bool:
        """True when no other server can share this store (SQLite under the data directory's lock)."""
        return self.db.dialect == "sqlite"

    def close(self) -> None:
        self.db.close()

    # Files

    def add_file(self, row: FileRow, *, owner: str | None = None) -> None:
        """Record a file, created by ``owner`` (else by ``row.created_by``)."""
        with self.db.transaction() as connection:
            _insert_file(connection, row, owner or row.created_by)

    @retry_reads
    def get_file(self, file_id: str, *, owner: str | None = None) -> FileRow | None:
        query = _owned(select(files), files, owner).where(files.c.id == file_id)
        with self.db.read() as connection:
            found = connection.execute(query).mappings().first()
        return file_row(found) if found else None

    @retry_reads
    def list_files(
        self,
        *,
        after: str | None,
        limit: int,
        order: str = "desc",
        purpose: str | None = None,
        owner: str | None = None,
    ) -> tuple[list[FileRow], bool]:
        """One page in ``created`` order (newest first for ``desc``) and whether more follow."""
        query = select(files) if purpose is None else select(files).where(files.c.purpose == purpose)
        rows, more = self._page(files, query, after=after, limit=limit, descending=order == "desc", owner=owner)
        return [file_row(row) for row in rows], more

    def delete_file(self, file_id: str, *, owner: str | None = None) -> FileRow | None:
        """Remove a file's row (None if there is none); refuse while an unfinished batch reads it."""
        query = _owned(select(files), files, owner).where(files.c.id == file_id)
        with self.db.transaction() as connection:
            found = connection.execute(query).mappings().first()
            if found is None:
                return None
            user = connection.execute(
                select(batches.c.id).where(batches.c.input_file_id == file_id, batches.c.status.in_(ACTIVE_STATUSES))
            ).first()
            if user is not None:
                raise Conflict(f"file {file_id} is the input of batch {user.id}, which has not finished")
            connection.execute(files.delete().where(files.c.id == file_id))
        return file_row(found)

    @retry_reads
    def expired_files(self, now: int) -> list[FileRow]:
        with self.db.read() as connection:
            rows = connection.execute(
                select(files).where(files.c.expires_at.is_not(None), files.c.expires_at <= now)
            ).mappings()
            return [file_row(row) for row in rows]

    # Batches as the API sees them

    def add_batch(self, row: BatchRow, *, owner: str | None = None) -> None:
        """A new batch, created by ``owner`` (else by ``row.created_by``); it starts coordinated by
        ``row.owner`` until ``row.lease_until`` when it has one (the routes create batches that no
        runner holds yet)."""
        with self.db.transaction() as connection:
            connection.execute(
                batches.insert().values(
                    id=row.id,
                    endpoint=row.endpoint,
                    input_file_id=row.input_file_id,
                    completion_window=row.completion_window,
                    status=row.status,
                    created_at=row.created_at,
                    expires_at=row.expires_at,
                    metadata=json.dumps(row.metadata) if row.metadata is not None else None,
                    output_expires_after=row.output_expires_after,
                    output_blob=row.output_blob,
                    error_blob=row.error_blob,
                    owner=row.owner,
                    lease_until=row.lease_until,
                    created_by=owner or row.created_by,
                )
            )

    @retry_reads
    def get_batch(self, batch_id: str, *, owner: str | None = None) -> BatchRow | None:
        with self.db.read() as connection:
            return _batch(connection, batch_id, owner)

    @retry_reads
    def settled_batch(self, batch_id: str) -> BatchRow | None:
        """The batch's row once every write under way on it has ended: read under the row's write
        lock (``FOR UPDATE`` on PostgreSQL; SQLite has one writer at a time). A commit whose reply
        was lost may still be finishing in the database; a plain read then sees the row as it was
        before, and a writer asking whether its commit landed would hear "no" about one that did.
        It only reads, so trying it again is safe."""
        with self.db.transaction() as connection:
            query = select(batches).where(batches.c.id == batch_id).with_for_update()
            found = connection.execute(query).mappings().first()
            return batch_row(found) if found else None

    @retry_reads
    def list_batches(self, *, after: str | None, limit: int, owner: str | None = None) -> tuple[list[BatchRow], bool]:
        rows, more = self._page(batches, select(batches), after=after, limit=limit, descending=True, owner=owner)
        return [batch_row(row) for row in rows], more

    def request_cancel(self, batch_id: str, now: int, *, owner: str | None = None) -> BatchRow | None:
        """``validating``/``in_progress`` become ``cancelling``; a cancel already under way is a no-op."""
        with self.db.transaction() as connection:
            status = connection.execute(
                _owned(select(batches.c.status), batches, owner).where(batches.c.id == batch_id)
            ).scalar()
            if status is None:
                return None
            if status in ("validating", "in_progress"):
                connection.execute(
                    update(batches).where(batches.c.id == batch_id).values(status="cancelling", cancelling_at=now)
                )
            elif status != "cancelling":
                raise Conflict(f"batch {batch_id} is {status}; only a validating or in-progress batch can be cancelled")
            return _batch(connection, batch_id, owner)

    # Batches as a runner coordinates them (their lines: `LineQueries`)

    def claim_batches(self, owner: str, now: float, lease_s: float, *, steal: bool = False) -> list[BatchRow]:
        """Take (or renew) the lease of every unfinished batch that is free, lapsed, or already ours;
        ``steal`` takes them all (a sole server starting up)."""
        active = batches.c.status.in_(ACTIVE_STATUSES)
        takeable = (
            active
            if steal
            else active & or_(batches.c.owner.is_(None), batches.c.owner == owner, batches.c.lease_until < now)
        )
        with self.db.transaction() as connection:
            connection.execute(update(batches).where(takeable).values(owner=owner, lease_until=now + lease_s))
            rows = connection.execute(
                select(batches).where(batches.c.owner == owner, active).order_by(batches.c.seq)
            ).mappings()
            return [batch_row(row) for row in rows]

    def release(self, owner: str) -> None:
        """Let go of every lease at a clean shutdown, so another runner need not wait for it to lapse."""
        with self.db.transaction() as connection:
            connection.execute(update(batches).where(batches.c.owner == owner).values(lease_until=0))

    def fail_batch(self, batch_id: str, owner: str, errors: list[dict[str, Any]], now: int) -> None:
        with self.db.transaction() as connection:
            fence(connection, batch_id, owner)
            connection.execute(
                update(batches)
                .where(batches.c.id == batch_id)
                .values(status="failed", failed_at=now, errors=json.dumps(errors))
            )

    def note_errors(self, batch_id: str, owner: str, errors: list[dict[str, Any]] | None) -> None:
        """Show (or, with None, clear) errors on a batch that goes on: why it is paused. The batch's
        next `commit_results` clears them."""
        with self.db.transaction() as connection:
            fence(connection, batch_id, owner)
            connection.execute(
                update(batches).where(batches.c.id == batch_id).values(errors=json.dumps(errors) if errors else None)
            )

    def set_finalizing(self, batch_id: str, owner: str, now: int) -> None:
        with self.db.transaction() as connection:
            fence(connection, batch_id, owner)
            connection.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.status == "in_progress")
                .values(status="finalizing", finalizing_at=now)
            )

    def finish(
        self, batch_id: str, owner: str, status: str, now: int, output_file: FileRow | None, error_file: FileRow | None
    ) -> bool:
        """End a batch as ``completed`` (from ``finalizing``), ``expired`` (from ``in_progress``) or
        ``cancelled`` (from ``cancelling``), publishing its result files, which belong to the batch's
        creator. False, changing nothing, when the batch is no longer in that state (a cancel came
        in meanwhile)."""
        with self.db.transaction() as connection:
            fence(connection, batch_id, owner)
            result = connection.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.status == _FINISHED_FROM[status])
                .values(
                    {
                        "status": status,
                        f"{status}_at": now,
                        "output_file_id": output_file.id if output_file else None,
                        "error_file_id": error_file.id if error_file else None,
                        "owner": None,
                        "lease_until": 0,
                    }
                )
            )
            if result.rowcount != 1:
                return False
            creator = connection.execute(select(batches.c.created_by).where(batches.c.id == batch_id)).scalar()
            for row in (output_file, error_file):
                if row is not None:
                    _insert_file(connection, row, creator)
        return True

    # Helpers

    def _page(
        self, table: Table, query: Select, *, after: str | None, limit: int, descending: bool, owner: str | None
    ) -> tuple[Sequence[RowMapping], bool]:
        query = _owned(query, table, owner)
        with self.db.read() as connection:
            if after is not None:
                anchor = connection.execute(
                    _owned(select(table.c.seq), table, owner).where(table.c.id == after)
                ).scalar()
                if anchor is None:
                    raise KeyError(after)
                query = query.where(table.c.seq < anchor if descending else table.c.seq > anchor)
            query = query.order_by(table.c.seq.desc() if descending else table.c.seq.asc()).limit(limit + 1)
            rows = connection.execute(query).mappings().all()
        return rows[:limit], len(rows) > limit


def _owned(query: Select, table: Table, owner: str | None) -> Select:
    """Only ``owner``'s rows (all of them for None)."""
    return query if owner is None else query.where(table.c.created_by == owner)


def _batch(connection: Connection, batch_id: str, owner: str | None) -> BatchRow | None:
    query = _owned(select(batches), batches, owner).where(batches.c.id == batch_id)
    found = connection.execute(query).mappings().first()
    return batch_row(found) if found else None


def _insert_file(connection: Connection, row: FileRow, created_by: str | None) -> None:
    connection.execute(
        files.insert().values(
            id=row.id,
            purpose=row.purpose,
            filename=row.filename,
            bytes=row.bytes,
            created_at=row.created_at,
            expires_at=row.expires_at,
            created_by=created_by,
        )
    )
