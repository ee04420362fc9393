"""A batch's lines in the store: indexed once when the batch starts, assigned to workers, ranked by
the global plan, read back in chunks, and marked done together with the batch's committed
lengths and counters (see `store` for why that commit is what makes a result count).

`LineQueries` is half of `BatchStore`; every write is fenced on the caller still holding the
batch's lease.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Update, bindparam, select, update

from sgl_blend.core.placement import Placement
from sgl_blend.server.db import Database, retry_reads
from sgl_blend.server.kill_points import kill_point
from sgl_blend.server.store_rows import (
    COMPLETED,
    FAILED,
    INSERT_CHUNK,
    PENDING,
    AlreadyCommitted,
    BatchCommit,
    LeaseLost,
    LineRow,
    line_row,
)
from sgl_blend.server.store_schema import batch_lines, batches

if TYPE_CHECKING:
    from sgl_blend.server.assignment import Slot

_lines = batch_lines.c


def fence(connection: Connection, batch_id: str, owner: str) -> None:
    """Raise `LeaseLost` unless ``owner`` coordinates the batch, and hold the batch's row until the
    write's transaction ends (``FOR UPDATE`` on PostgreSQL; SQLite has one writer at a time): a
    runner taking the batch over waits for a fenced write under way, and a coordinator that stalled
    past its lease can no longer commit once another took the batch."""
    holder = connection.execute(select(batches.c.owner).where(batches.c.id == batch_id).with_for_update()).first()
    if holder is None or holder.owner != owner:
        raise LeaseLost(f"batch {batch_id} is coordinated by {holder.owner if holder else 'nobody'}, not {owner}")


class LineQueries:
    db: Database

    def clear_lines(self, batch_id: str, owner: str) -> set[int] | None:
        """Drop the unfinished lines an interrupted validation of the batch stored, and return the
        line numbers that already have a result (the runner feeds lines while it validates, so a
        validation that starts again must skip them); None, changing nothing, when the batch is no
        longer ``validating`` (cancelled meanwhile)."""
        with self.db.transaction() as connection:
            fence(connection, batch_id, owner)
            status = connection.execute(select(batches.c.status).where(batches.c.id == batch_id)).scalar_one()
            if status != "validating":
                return None
            connection.execute(batch_lines.delete().where(_lines.batch_id == batch_id, _lines.state == PENDING))
            done = connection.execute(select(_lines.line_number).where(_lines.batch_id == batch_id)).scalars()
            return set(done)

    def add_lines(self, batch_id: str, owner: str, lines: Sequence[LineRow]) -> None:
        """Store one chunk of a validating batch's line index. Chunks commit one by one, so a long
        validation never holds the store's write lock; the batch starts only in `start_batch`."""
        rows = [
            {
                "batch_id": batch_id,
                "line_number": line.line_number,
                "custom_id": line.custom_id,
                "byte_offset": line.byte_offset,
                "byte_length": line.byte_length,
                "state": PENDING,
                "error_code": line.error_code,
                "error_message": line.error_message,
            }
            for line in lines
        ]
        with self.db.transaction() as connection:
            fence(connection, batch_id, owner)
            for start in range(0, len(rows), INSERT_CHUNK):
                connection.execute(batch_lines.insert(), rows[start : start + INSERT_CHUNK])
        kill_point("lines_added")

    def start_batch(self, batch_id: str, owner: str, total: int, now: int) -> bool:
        """Move a validated batch to ``in_progress`` with its ``total`` lines. False, changing
        nothing, when the batch is no longer ``validating`` (cancelled meanwhile)."""
        with self.db.transaction() as connection:
            fence(connection, batch_id, owner)
            result = connection.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.status == "validating")
                .values(status="in_progress", in_progress_at=now, total=total)
            )
            return result.rowcount == 1

    def assign(self, batch_id: str, owner: str, assignment: Mapping[Slot, Sequence[int]]) -> None:
        """Record where each of the batch's unfinished lines runs (slot -> line numbers)."""
        rows = [
            {"worker_": slot.worker, "dp_rank_": slot.dp_rank, "line": line}
            for slot, lines in assignment.items()
            for line in lines
        ]
        statement = (
            update(batch_lines)
            .where(_lines.batch_id == batch_id, _lines.state == PENDING, _lines.line_number == bindparam("line"))
            .values(worker=bindparam("worker_"), dp_rank=bindparam("dp_rank_"))
        )
        self._update_lines(batch_id, owner, statement, rows)

    def set_plan(self, batch_id: str, owner: str, places: Sequence[tuple[int, int, Placement | None]]) -> None:
        """Record each unfinished line's place in the global plan: (line number, rank in the feed
        order, its placement). A restarted runner feeds by it without planning again."""
        rows = [
            {"rank": rank, "placement_": placement.encode() if placement else None, "line": line}
            for line, rank, placement in places
        ]
        statement = (
            update(batch_lines)
            .where(_lines.batch_id == batch_id, _lines.state == PENDING, _lines.line_number == bindparam("line"))
            .values(plan_rank=bindparam("rank"), placement=bindparam("placement_"))
        )
        self._update_lines(batch_id, owner, statement, rows)
        kill_point("plan_stored")

    @retry_reads
    def pending_lines(
        self,
        batch_id: str,
        *,
        after_line: int = 0,
        limit: int | None = None,
        worker: str | None = None,
        slot: Slot | None = None,
        after_rank: int | None = None,
    ) -> list[LineRow]:
        """The unfinished lines after ``after_line`` in file order, at most ``limit`` of them (of one
        worker's share when ``worker`` is given, of one slot's when ``slot`` is). With
        ``after_rank``, the planned lines after that plan rank instead, in plan order."""
        query = select(batch_lines).where(_lines.batch_id == batch_id, _lines.state == PENDING)
        if after_rank is None:
            query = query.where(_lines.line_number > after_line).order_by(_lines.line_number)
        else:
            query = query.where(_lines.plan_rank > after_rank).order_by(_lines.plan_rank, _lines.line_number)
        if slot is not None:
            worker = slot.worker
            query = query.where(_lines.dp_rank.is_(None) if slot.dp_rank is None else _lines.dp_rank == slot.dp_rank)
        if worker is not None:
            query = query.where(_lines.worker == worker)
        if limit is not None:
            query = query.limit(limit)
        with self.db.read() as connection:
            return [line_row(row) for row in connection.execute(query).mappings()]

    @retry_reads
    def lines(self, batch_id: str) -> list[LineRow]:
        """Every line of the batch, finished or not, in file order: where each ran and how it ended."""
        with self.db.read() as connection:
            rows = connection.execute(
                select(batch_lines).where(_lines.batch_id == batch_id).order_by(_lines.line_number)
            ).mappings()
            return [line_row(row) for row in rows]

    def commit_results(self, owner: str, commit: BatchCommit) -> None:
        """Mark lines done and move the committed lengths and counters, in one transaction, and
        clear what `BatchStore.note_errors` showed (results are being written again). Raises
        `LeaseLost` if another runner took the batch over, and `AlreadyCommitted` if a line is no
        longer pending; either way nothing changes."""
        lines = commit.completed_lines + commit.failed_lines
        with self.db.transaction() as connection:
            fence(connection, commit.batch_id, owner)
            pending: set[int] = set()
            for start in range(0, len(lines), INSERT_CHUNK):
                chunk = lines[start : start + INSERT_CHUNK]
                pending.update(
                    connection.execute(
                        select(_lines.line_number).where(
                            _lines.batch_id == commit.batch_id, _lines.state == PENDING, _lines.line_number.in_(chunk)
                        )
                    ).scalars()
                )
            if len(pending) != len(lines):
                raise AlreadyCommitted(commit.batch_id, set(lines) - pending)
            mark = (
                update(batch_lines)
                .where(_lines.batch_id == commit.batch_id, _lines.line_number == bindparam("line"))
                .values(state=bindparam("state_"))
            )
            done = [{"line": line, "state_": COMPLETED} for line in commit.completed_lines] + [
                {"line": line, "state_": FAILED} for line in commit.failed_lines
            ]
            for start in range(0, len(done), INSERT_CHUNK):
                connection.execute(mark, done[start : start + INSERT_CHUNK])
            connection.execute(
                update(batches)
                .where(batches.c.id == commit.batch_id)
                .values(
                    completed=batches.c.completed + len(commit.completed_lines),
                    failed=batches.c.failed + len(commit.failed_lines),
                    input_tokens=batches.c.input_tokens + commit.input_tokens,
                    cached_tokens=batches.c.cached_tokens + commit.cached_tokens,
                    output_tokens=batches.c.output_tokens + commit.output_tokens,
                    output_bytes=commit.output_bytes,
                    error_bytes=commit.error_bytes,
                    errors=None,
                )
            )
            kill_point("before_commit")
        kill_point("after_commit")

    def _update_lines(self, batch_id: str, owner: str, statement: Update, rows: list[dict]) -> None:
        with self.db.transaction() as connection:
            fence(connection, batch_id, owner)
            for start in range(0, len(rows), INSERT_CHUNK):
                connection.execute(statement, rows[start : start + INSERT_CHUNK])
