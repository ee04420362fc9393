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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from sgl_blend.server.db import Database, open_database

if TYPE_CHECKING:
    from sgl_blend.server.assignment import Slot

ACTIVE_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL_STATUSES = ("completed", "failed", "expired", "cancelled")
PENDING, COMPLETED, FAILED = "pending", "completed", "failed"
_FINISHED_FROM = {"completed": "finalizing", "expired": "in_progress", "cancelled": "cancelling"}
_INSERT_CHUNK = 1000

_SCHEMA = (
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
    "CREATE INDEX IF NOT EXISTS batch_lines_todo ON batch_lines (batch_id, state, worker, dp_rank, line_number)",
    "CREATE INDEX IF NOT EXISTS batches_active ON batches (status, lease_until)",
)


class Conflict(Exception):
    """The object is not in a state that allows the request (cancelling a finished batch, ...)."""


class LeaseLost(Exception):
    """This runner no longer coordinates the batch: another one took it over."""


class AlreadyCommitted(Exception):
    """Some lines of a commit were already done: committing them again would count them twice."""

    def __init__(self, batch_id: str, lines: set[int]) -> None:
        super().__init__(f"batch {batch_id}: lines {sorted(lines)} were already committed")
        self.lines = lines


@dataclass(frozen=True)
class FileRow:
    id: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    expires_at: int | None = None


@dataclass(frozen=True)
class BatchRow:
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    output_blob: str
    error_blob: str
    metadata: dict[str, str] | None = None
    output_expires_after: int | None = None
    errors: list[dict[str, Any]] | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    output_bytes: int = 0
    error_bytes: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    owner: str | None = None
    lease_until: float = 0.0


@dataclass(frozen=True)
class LineRow:
    """One non-blank line of a batch's input. ``error_code`` set: the line is invalid and fails
    without running (its error record is written like any other result)."""

    line_number: int
    custom_id: str | None
    byte_offset: int
    byte_length: int
    state: str = PENDING
    error_code: str | None = None
    error_message: str | None = None
    worker: str | None = None
    dp_rank: int | None = None
    plan_rank: int | None = None
    placement: str | None = None


@dataclass
class BatchCommit:
    """What one group of finished lines changes in one batch, committed atomically."""

    batch_id: str
    completed_lines: list[int] = field(default_factory=list)
    failed_lines: list[int] = field(default_factory=list)
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    output_bytes: int = 0
    error_bytes: int = 0


_BATCH_JSON_COLUMNS = ("metadata", "errors")
_BATCH_FIELDS = tuple(BatchRow.__dataclass_fields__)
_LINE_FIELDS = tuple(LineRow.__dataclass_fields__)


def _batch(row: dict[str, Any]) -> BatchRow:
    values = {name: row[name] for name in _BATCH_FIELDS}
    for name in _BATCH_JSON_COLUMNS:
        values[name] = json.loads(values[name]) if values[name] is not None else None
    return BatchRow(**values)


def _file(row: dict[str, Any]) -> FileRow:
    return FileRow(**{name: row[name] for name in FileRow.__dataclass_fields__})


class BatchStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        with db.transaction() as tx:
            for statement in _SCHEMA[:3]:
                tx.execute(db.ddl(statement))
        for column, kind in (("dp_rank", "BIGINT"), ("plan_rank", "BIGINT"), ("placement", "TEXT")):
            self._add_line_column(column, kind)
        with db.transaction() as tx:
            for statement in _SCHEMA[3:]:
                tx.execute(db.ddl(statement))

    def _add_line_column(self, column: str, kind: str) -> None:
        """A store made before lines had ``column`` gets it, NULL in its lines (a DP rank: any
        rank; a plan rank: not planned yet)."""
        try:
            with self.db.transaction() as tx:
                tx.execute(f"SELECT {column} FROM batch_lines WHERE 1 = 0")
        except Exception:
            with self.db.transaction() as tx:
                tx.execute("DROP INDEX IF EXISTS batch_lines_todo")
                tx.execute(f"ALTER TABLE batch_lines ADD COLUMN {column} {kind}")

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
            tx.execute("INSERT INTO files (id, purpose, filename, bytes, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
                       (row.id, row.purpose, row.filename, row.bytes, row.created_at, row.expires_at))

    def get_file(self, file_id: str) -> FileRow | None:
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT * FROM files WHERE id = ?", (file_id,))
        return _file(rows[0]) if rows else None

    def list_files(self, *, after: str | None, limit: int, order: str = "desc",
                   purpose: str | None = None) -> tuple[list[FileRow], bool]:
        """One page in ``created`` order (newest first for ``desc``) and whether more follow."""
        rows, more = self._page("files", after=after, limit=limit, descending=order == "desc",
                                where=("purpose = ?", (purpose,)) if purpose else None)
        return [_file(row) for row in rows], more

    def delete_file(self, file_id: str) -> FileRow | None:
        """Remove a file's row (None if there is none); refuse while an unfinished batch reads it."""
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT * FROM files WHERE id = ?", (file_id,))
            if not rows:
                return None
            users = tx.execute(
                f"SELECT id FROM batches WHERE input_file_id = ? AND status IN ({_marks(ACTIVE_STATUSES)})",
                (file_id, *ACTIVE_STATUSES))
            if users:
                raise Conflict(f"file {file_id} is the input of batch {users[0]['id']}, which has not finished")
            tx.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return _file(rows[0])

    def expired_files(self, now: int) -> list[FileRow]:
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT * FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,))
        return [_file(row) for row in rows]

    # Batches as the API sees them

    def add_batch(self, row: BatchRow) -> None:
        with self.db.transaction() as tx:
            tx.execute(
                "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, created_at, expires_at,"
                " metadata, output_expires_after, output_blob, error_blob) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row.id, row.endpoint, row.input_file_id, row.completion_window, row.status, row.created_at,
                 row.expires_at, json.dumps(row.metadata) if row.metadata is not None else None,
                 row.output_expires_after, row.output_blob, row.error_blob))

    def get_batch(self, batch_id: str) -> BatchRow | None:
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return _batch(rows[0]) if rows else None

    def list_batches(self, *, after: str | None, limit: int) -> tuple[list[BatchRow], bool]:
        rows, more = self._page("batches", after=after, limit=limit, descending=True)
        return [_batch(row) for row in rows], more

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

    # Batches as a runner coordinates them

    def claim_batches(self, owner: str, now: float, lease_s: float, *, steal: bool = False) -> list[BatchRow]:
        """Take (or renew) the lease of every unfinished batch that is free, lapsed, or already ours;
        ``steal`` takes them all (a sole server starting up)."""
        with self.db.transaction() as tx:
            condition = "" if steal else " AND (owner IS NULL OR owner = ? OR lease_until < ?)"
            params: tuple = (owner, now + lease_s, *ACTIVE_STATUSES) + (() if steal else (owner, now))
            tx.execute(f"UPDATE batches SET owner = ?, lease_until = ? WHERE status IN ({_marks(ACTIVE_STATUSES)})"
                       + condition, params)
            rows = tx.execute(f"SELECT * FROM batches WHERE owner = ? AND status IN ({_marks(ACTIVE_STATUSES)})"
                              " ORDER BY seq", (owner, *ACTIVE_STATUSES))
        return [_batch(row) for row in rows]

    def release(self, owner: str) -> None:
        """Let go of every lease at a clean shutdown, so another runner need not wait for it to lapse."""
        with self.db.transaction() as tx:
            tx.execute("UPDATE batches SET lease_until = 0 WHERE owner = ?", (owner,))

    def start_batch(self, batch_id: str, owner: str, lines: Iterable[LineRow], now: int) -> int | None:
        """Record a validated input's line index and move the batch to ``in_progress``, atomically:
        an exception from ``lines`` (the file as a whole is invalid) leaves nothing behind. None,
        changing nothing, when the batch is no longer ``validating`` (cancelled, or started already)."""
        total = 0
        with self.db.transaction() as tx:
            self._fence(tx, batch_id, owner)
            if tx.execute("SELECT status FROM batches WHERE id = ?", (batch_id,))[0]["status"] != "validating":
                return None
            chunk: list[tuple] = []
            for line in lines:
                total += 1
                chunk.append((batch_id, line.line_number, line.custom_id, line.byte_offset, line.byte_length,
                              PENDING, line.error_code, line.error_message))
                if len(chunk) >= _INSERT_CHUNK:
                    self._insert_lines(tx, chunk)
                    chunk = []
            self._insert_lines(tx, chunk)
            tx.execute("UPDATE batches SET status = 'in_progress', in_progress_at = ?, total = ? WHERE id = ?",
                       (now, total, batch_id))
        return total

    def fail_batch(self, batch_id: str, owner: str, errors: list[dict[str, Any]], now: int) -> None:
        with self.db.transaction() as tx:
            self._fence(tx, batch_id, owner)
            tx.execute("UPDATE batches SET status = 'failed', failed_at = ?, errors = ? WHERE id = ?",
                       (now, json.dumps(errors), batch_id))

    def assign(self, batch_id: str, owner: str, assignment: Mapping[Slot, Sequence[int]]) -> None:
        """Record where each of the batch's unfinished lines runs (slot -> line numbers)."""
        rows = [(slot.worker, slot.dp_rank, batch_id, PENDING, line)
                for slot, lines in assignment.items() for line in lines]
        with self.db.transaction() as tx:
            self._fence(tx, batch_id, owner)
            for start in range(0, len(rows), _INSERT_CHUNK):
                tx.executemany("UPDATE batch_lines SET worker = ?, dp_rank = ? WHERE batch_id = ? AND state = ?"
                               " AND line_number = ?", rows[start:start + _INSERT_CHUNK])

    def set_plan(self, batch_id: str, owner: str, places: Sequence[tuple[int, int, str | None]]) -> None:
        """Record each unfinished line's place in the global plan: (line number, rank in the feed
        order, its placement's text). A restarted runner feeds by it without planning again."""
        rows = [(rank, placement, batch_id, PENDING, line) for line, rank, placement in places]
        with self.db.transaction() as tx:
            self._fence(tx, batch_id, owner)
            for start in range(0, len(rows), _INSERT_CHUNK):
                tx.executemany("UPDATE batch_lines SET plan_rank = ?, placement = ? WHERE batch_id = ? AND state = ?"
                               " AND line_number = ?", rows[start:start + _INSERT_CHUNK])

    def unplanned_lines(self, batch_id: str) -> int:
        """How many unfinished lines of the batch have no plan rank."""
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT COUNT(*) AS n FROM batch_lines WHERE batch_id = ? AND state = ?"
                              " AND plan_rank IS NULL", (batch_id, PENDING))
        return int(rows[0]["n"])

    def pending_lines(self, batch_id: str, *, after_line: int = 0, limit: int | None = None,
                      worker: str | None = None, slot: Slot | None = None,
                      after_rank: int | None = None) -> list[LineRow]:
        """The unfinished lines after ``after_line`` in file order, at most ``limit`` of them (of one
        worker's share when ``worker`` is given, of one slot's when ``slot`` is). With
        ``after_rank``, the planned lines after that plan rank instead, in plan order."""
        if after_rank is None:
            sql = "SELECT * FROM batch_lines WHERE batch_id = ? AND state = ? AND line_number > ?"
            params: tuple = (batch_id, PENDING, after_line)
        else:
            sql = "SELECT * FROM batch_lines WHERE batch_id = ? AND state = ? AND plan_rank > ?"
            params = (batch_id, PENDING, after_rank)
        if slot is not None:
            worker = slot.worker
            sql += " AND dp_rank IS NULL" if slot.dp_rank is None else " AND dp_rank = ?"
            params += () if slot.dp_rank is None else (slot.dp_rank,)
        if worker is not None:
            sql += " AND worker = ?"
            params += (worker,)
        sql += " ORDER BY line_number" if after_rank is None else " ORDER BY plan_rank, line_number"
        if limit is not None:
            sql += " LIMIT ?"
            params += (limit,)
        with self.db.transaction() as tx:
            rows = tx.execute(sql, params)
        return [LineRow(**{name: row[name] for name in _LINE_FIELDS}) for row in rows]

    def commit_results(self, owner: str, commit: BatchCommit) -> None:
        """Mark lines done and move the committed lengths and counters, in one transaction.
        Raises `LeaseLost` if another runner took the batch over, and `AlreadyCommitted` if a line
        is no longer pending; either way nothing changes."""
        lines = commit.completed_lines + commit.failed_lines
        with self.db.transaction() as tx:
            self._fence(tx, commit.batch_id, owner)
            pending: set[int] = set()
            for start in range(0, len(lines), _INSERT_CHUNK):
                chunk = lines[start:start + _INSERT_CHUNK]
                rows = tx.execute(f"SELECT line_number FROM batch_lines WHERE batch_id = ? AND state = ?"
                                  f" AND line_number IN ({_marks(chunk)})", (commit.batch_id, PENDING, *chunk))
                pending.update(row["line_number"] for row in rows)
            if len(pending) != len(lines):
                raise AlreadyCommitted(commit.batch_id, set(lines) - pending)
            for state, numbers in ((COMPLETED, commit.completed_lines), (FAILED, commit.failed_lines)):
                tx.executemany("UPDATE batch_lines SET state = ? WHERE batch_id = ? AND line_number = ?",
                               [(state, commit.batch_id, line) for line in numbers])
            tx.execute(
                "UPDATE batches SET completed = completed + ?, failed = failed + ?, input_tokens = input_tokens + ?,"
                " cached_tokens = cached_tokens + ?, output_tokens = output_tokens + ?, output_bytes = ?,"
                " error_bytes = ? WHERE id = ?",
                (len(commit.completed_lines), len(commit.failed_lines), commit.input_tokens, commit.cached_tokens,
                 commit.output_tokens, commit.output_bytes, commit.error_bytes, commit.batch_id))

    def set_finalizing(self, batch_id: str, owner: str, now: int) -> None:
        with self.db.transaction() as tx:
            self._fence(tx, batch_id, owner)
            tx.execute("UPDATE batches SET status = 'finalizing', finalizing_at = ? WHERE id = ? AND status = 'in_progress'",
                       (now, batch_id))

    def finish(self, batch_id: str, owner: str, status: str, now: int,
               output_file: FileRow | None, error_file: FileRow | None) -> bool:
        """End a batch as ``completed`` (from ``finalizing``), ``expired`` (from ``in_progress``) or
        ``cancelled`` (from ``cancelling``), publishing its result files. False, changing nothing, when
        the batch is no longer in that state (a cancel came in meanwhile)."""
        with self.db.transaction() as tx:
            self._fence(tx, batch_id, owner)
            tx.execute(f"UPDATE batches SET status = ?, {status}_at = ?, output_file_id = ?, error_file_id = ?,"
                       " owner = NULL, lease_until = 0 WHERE id = ? AND status = ?",
                       (status, now, output_file.id if output_file else None, error_file.id if error_file else None,
                        batch_id, _FINISHED_FROM[status]))
            if tx.rowcount != 1:
                return False
            for row in (output_file, error_file):
                if row is not None:
                    tx.execute("INSERT INTO files (id, purpose, filename, bytes, created_at, expires_at)"
                               " VALUES (?, ?, ?, ?, ?, ?)",
                               (row.id, row.purpose, row.filename, row.bytes, row.created_at, row.expires_at))
        return True

    # Helpers

    def _fence(self, tx: Any, batch_id: str, owner: str) -> None:
        rows = tx.execute("SELECT owner FROM batches WHERE id = ?", (batch_id,))
        if not rows or rows[0]["owner"] != owner:
            raise LeaseLost(f"batch {batch_id} is coordinated by {rows[0]['owner'] if rows else 'nobody'}, not {owner}")

    @staticmethod
    def _insert_lines(tx: Any, chunk: list[tuple]) -> None:
        if chunk:
            tx.executemany("INSERT INTO batch_lines (batch_id, line_number, custom_id, byte_offset, byte_length, state,"
                           " error_code, error_message) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", chunk)

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


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)
