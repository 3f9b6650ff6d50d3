"""Deliberately broken dialects: each overrides one method of a real dialect with the
mistake it is named after. The state machine must catch every one of them
(test_broken_variants.py); a suite that passed them would prove nothing. The letters
(a)-(d) are the classes of mistake listed in docs/internals.md, with the invariants
each one breaks.

They are mixins, so one mistake can be applied to each backend's dialect:
``broken(NoLockClaim, PostgreSQLDialect)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Table,
    and_,
    insert,
    literal_column,
    or_,
    select,
    true,
    update,
)

from dbworker.core.status import OPEN, Phase
from dbworker.core.transitions import Transition
from dbworker.dialects import Claim, Dialect, WorkerTable
from dbworker.dialects.base import CANCELLED
from dbworker.dialects.terms import NEVER_ISSUED_TOKEN


def _status(table: Table, phase: Phase) -> ColumnElement[bool]:
    return table.c.status == literal_column(f"'{phase.value}'")


class NoLockClaim(Dialect):
    """(a) Selects candidates without FOR UPDATE / SKIP LOCKED: a second claimer picks
    the rows a claim in progress holds and then waits on them (or, with threads,
    overwrites that claim)."""

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        rows = conn.execute(self.candidates(worker, eligible, limit, self.now())).all()
        return [Claim(*row) for row in rows]


class WaitingClaim(Dialect):
    """(a, PostgreSQL) Locks with FOR UPDATE but without SKIP LOCKED: a second claimer
    queues behind a claim in progress instead of taking the next rows."""

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        query = self.candidates(worker, eligible, limit, self.now())
        return [Claim(*row) for row in conn.execute(query.with_for_update(of=worker.table))]


class UnguardedClaim(Dialect):
    """(a, SQLite) One writer at a time makes a missing lock unobservable in one thread,
    so the claim forgets its guard instead: FINISHED and FAILED rows, running claims and
    delayed retries are all "claimable"."""

    def claimable(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        return true()


class UnfencedFinish(Dialect):
    """(b) Completes without checking the token: a holder whose lease expired and was
    taken over still finishes the item, and its handler's writes commit."""

    def finish(self, conn: Connection, worker: WorkerTable, source_id: Any, token: int) -> bool:
        table = worker.table
        statement = (
            update(table)
            .where(table.c.source_id == source_id, _status(table, Phase.WORKING))
            .values(status=Phase.FINISHED.value, lease_expires_at=None, error=None)
        )
        return conn.execute(statement).rowcount == 1


class UnfencedFinishAll(Dialect):
    """(b) A group's FINISH that matches the ids and not their tokens: a group holding a
    claim that was taken over commits its handler's writes anyway."""

    def finish_all(
        self, conn: Connection, worker: WorkerTable, held: Sequence[tuple[Any, int]]
    ) -> int:
        # The real statement, given each row's current token instead of the holder's.
        table = worker.table
        ids = [sid for sid, _ in held]
        query = select(table.c.source_id, table.c.token).where(table.c.source_id.in_(ids))
        current = {sid: token for sid, token in conn.execute(query).all()}
        return super().finish_all(conn, worker, [(sid, current[sid]) for sid in ids])


class UnfencedFinishAlone(Dialect):
    """(b) The ending of a handler that wrote nothing, fenced by the row's current token
    instead of the holder's: a holder whose claim was taken over finishes the item
    under its new holder."""

    def record_alone(
        self, conn: Connection, worker: WorkerTable, source_id: Any, token: int, decision: Any
    ) -> bool:
        table = worker.table
        query = select(table.c.token).where(table.c.source_id == source_id)
        current = conn.execute(query).scalar_one()
        conn.commit()  # the read's transaction: record_alone starts in none
        return super().record_alone(conn, worker, source_id, current, decision)


class UnfencedRenew(Dialect):
    """(c) Renews without checking the token: a holder that lost its claim never finds
    out, and extends the new holder's lease."""

    def renew(
        self,
        conn: Connection,
        worker: WorkerTable,
        held: Any,
        lease_seconds: float,
    ) -> list[Any]:
        table = worker.table
        lost = []
        for source_id, _token in held:
            statement = (
                update(table)
                .where(table.c.source_id == source_id, _status(table, Phase.WORKING))
                .values(lease_expires_at=self.now() + lease_seconds)
            )
            if conn.execute(statement).rowcount != 1:
                lost.append(source_id)
        return lost


class LeaseIgnoringTakeover(Dialect):
    """(d) Takes over WORKING records whether or not their lease has run out."""

    def claimable(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        open_ = table.c.status.in_([literal_column(f"'{p.value}'") for p in sorted(OPEN)])
        due = (table.c.not_before.is_(None)) | (table.c.not_before <= now)
        return and_(open_, ~_status(table, Phase.UNFINISHED) | due)


class CancelLeavesUndiscovered(Dialect):
    """(e) Cancels only records that exist: an item not discovered yet gets none, and
    discovery then makes it pending and a claim runs it."""

    def cancel(self, conn: Connection, worker: WorkerTable, source_id: Any) -> bool:
        return self.transition(
            conn, worker, Transition.CANCEL, source_id, NEVER_ISSUED_TOKEN, error=CANCELLED
        )


class ClaimsCancelled(Dialect):
    """(e) The claim guard admits cancelled records (FAILED with dbworker.Cancelled)."""

    def claimable(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        cancelled = and_(_status(table, Phase.FAILED), table.c.error_type == CANCELLED.type)
        return or_(super().claimable(table, now), cancelled)


def broken(mistake: type, base: type[Dialect]) -> type[Dialect]:
    """``base`` (a real dialect class) with ``mistake``'s one override (a mixin, abstract
    on its own)."""
    return type(f"{mistake.__name__}{base.__name__}", (mistake, base), {})


class DoubledTick(Dialect):
    """(e) Inserts a tick without ignoring a slot already made: a second coordinator
    making the same slot fails (or, without the unique constraint, makes it twice)."""

    def insert_ticks(
        self, conn: Connection, ticks: Table, worker: str, slots: Sequence[int]
    ) -> None:
        conn.execute(insert(ticks), [{"worker": worker, "slot": slot} for slot in slots])
