"""A batch's lines in the store: indexed once when the batch starts, assigned to workers, ranked by
the global plan, read back in chunks, and marked done together with the batch's committed
lengths and counters (see `store` for why that commit is what makes a result count).

`LineQueries` is half of `BatchStore`; every write is fenced on the caller still holding the
batch's lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from sgl_blend.core.placement import Placement
from sgl_blend.server.db import Database
from sgl_blend.server.store_rows import (COMPLETED, FAILED, INSERT_CHUNK, PENDING, AlreadyCommitted, BatchCommit,
                                         LeaseLost, LineRow, line_row, marks)

if TYPE_CHECKING:
    from sgl_blend.server.assignment import Slot


def fence(tx: Any, batch_id: str, owner: str) -> None:
    """Raise `LeaseLost` unless ``owner`` coordinates the batch (inside the write's transaction)."""
    rows = tx.execute("SELECT owner FROM batches WHERE id = ?", (batch_id,))
    if not rows or rows[0]["owner"] != owner:
        raise LeaseLost(f"batch {batch_id} is coordinated by {rows[0]['owner'] if rows else 'nobody'}, not {owner}")


class LineQueries:
    db: Database

    def clear_lines(self, batch_id: str, owner: str) -> bool:
        """Drop what an interrupted validation of the batch stored; False, changing nothing, when
        the batch is no longer ``validating`` (cancelled meanwhile)."""
        with self.db.transaction() as tx:
            fence(tx, batch_id, owner)
            if tx.execute("SELECT status FROM batches WHERE id = ?", (batch_id,))[0]["status"] != "validating":
                return False
            tx.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
        return True

    def add_lines(self, batch_id: str, owner: str, lines: Sequence[LineRow]) -> None:
        """Store one chunk of a validating batch's line index. Chunks commit one by one, so a long
        validation never holds the store's write lock; the batch starts only in `start_batch`."""
        rows = [(batch_id, line.line_number, line.custom_id, line.byte_offset, line.byte_length, PENDING,
                 line.error_code, line.error_message) for line in lines]
        with self.db.transaction() as tx:
            fence(tx, batch_id, owner)
            for start in range(0, len(rows), INSERT_CHUNK):
                _insert_lines(tx, rows[start:start + INSERT_CHUNK])

    def start_batch(self, batch_id: str, owner: str, total: int, now: int) -> bool:
        """Move a validated batch to ``in_progress`` with its ``total`` lines. False, changing
        nothing, when the batch is no longer ``validating`` (cancelled meanwhile)."""
        with self.db.transaction() as tx:
            fence(tx, batch_id, owner)
            tx.execute("UPDATE batches SET status = 'in_progress', in_progress_at = ?, total = ? WHERE id = ?"
                       " AND status = 'validating'", (now, total, batch_id))
            return tx.rowcount == 1

    def assign(self, batch_id: str, owner: str, assignment: Mapping[Slot, Sequence[int]]) -> None:
        """Record where each of the batch's unfinished lines runs (slot -> line numbers)."""
        rows = [(slot.worker, slot.dp_rank, batch_id, PENDING, line)
                for slot, lines in assignment.items() for line in lines]
        with self.db.transaction() as tx:
            fence(tx, batch_id, owner)
            for start in range(0, len(rows), INSERT_CHUNK):
                tx.executemany("UPDATE batch_lines SET worker = ?, dp_rank = ? WHERE batch_id = ? AND state = ?"
                               " AND line_number = ?", rows[start:start + INSERT_CHUNK])

    def set_plan(self, batch_id: str, owner: str, places: Sequence[tuple[int, int, Placement | None]]) -> None:
        """Record each unfinished line's place in the global plan: (line number, rank in the feed
        order, its placement). A restarted runner feeds by it without planning again."""
        rows = [(rank, placement.encode() if placement else None, batch_id, PENDING, line)
                for line, rank, placement in places]
        with self.db.transaction() as tx:
            fence(tx, batch_id, owner)
            for start in range(0, len(rows), INSERT_CHUNK):
                tx.executemany("UPDATE batch_lines SET plan_rank = ?, placement = ? WHERE batch_id = ? AND state = ?"
                               " AND line_number = ?", rows[start:start + INSERT_CHUNK])

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
        return [line_row(row) for row in rows]

    def lines(self, batch_id: str) -> list[LineRow]:
        """Every line of the batch, finished or not, in file order: where each ran and how it ended."""
        with self.db.transaction() as tx:
            rows = tx.execute("SELECT * FROM batch_lines WHERE batch_id = ? ORDER BY line_number", (batch_id,))
        return [line_row(row) for row in rows]

    def commit_results(self, owner: str, commit: BatchCommit) -> None:
        """Mark lines done and move the committed lengths and counters, in one transaction.
        Raises `LeaseLost` if another runner took the batch over, and `AlreadyCommitted` if a line
        is no longer pending; either way nothing changes."""
        lines = commit.completed_lines + commit.failed_lines
        with self.db.transaction() as tx:
            fence(tx, commit.batch_id, owner)
            pending: set[int] = set()
            for start in range(0, len(lines), INSERT_CHUNK):
                chunk = lines[start:start + INSERT_CHUNK]
                rows = tx.execute(f"SELECT line_number FROM batch_lines WHERE batch_id = ? AND state = ?"
                                  f" AND line_number IN ({marks(chunk)})", (commit.batch_id, PENDING, *chunk))
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


def _insert_lines(tx: Any, chunk: list[tuple]) -> None:
    if chunk:
        tx.executemany("INSERT INTO batch_lines (batch_id, line_number, custom_id, byte_offset, byte_length, state,"
                       " error_code, error_message) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", chunk)
