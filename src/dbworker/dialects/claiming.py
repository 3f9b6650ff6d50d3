"""Claiming: the shared SQL that finds claimable records in the eligible query's order,
locks them and gives each a new token and lease (a part of ``Dialect``).

A database overrides ``candidates`` (how the eligible query is rewritten so that its
planner reads the open records first), ``lock_candidates`` (how the records are locked
without waiting for other claimers) or ``claim`` itself (one statement that does it all,
declared by ``supports_one_statement_claims``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Table,
    and_,
    or_,
    select,
    update,
)

from ..core.status import OPEN, Phase
from .claim_values import claim_values
from .interface import DialectInterface
from .limited import claim_limited
from .terms import (
    Claim,
    Claims,
    Owner,
    WorkerTable,
    by_position,
    claim_columns,
    keys_in,
    status_in,
    status_literal,
)


class Claiming(DialectInterface):
    """The claim of a batch: ``claimable`` guards it, ``candidates`` searches,
    ``lock_candidates`` locks, ``claim`` updates."""

    #: Whether a statement that fails (a unique violation) leaves the transaction
    #: usable, the statement alone rolled back (MySQL), rather than lost (PostgreSQL).
    failed_statement_keeps_transaction: ClassVar[bool] = False
    #: Whether limited claims run as data-modifying CTEs (PostgreSQL): an exclusive_by
    #: claim's search and UPDATE in one statement, and a rated claim's slots locked and
    #: stamped in its claim's statement, over the claim's RETURNING.
    supports_stamp_in_claim: ClassVar[bool] = False
    #: The statuses ``claimable`` admits at all (a search may read only their records).
    claimable_phases: ClassVar[frozenset[Phase]] = OPEN

    def claimable(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        """SQL for ``core.transitions.Record.claimable``: CLAIM or TAKEOVER is legal now."""
        if now is self._db_clock:
            built: ColumnElement[bool] = self._built_once(
                ("claimable", table), lambda: self._claimable_at(table, now)
            )
            return built
        return self._claimable_at(table, now)

    def _claimable_at(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        status = table.c.status
        return and_(
            status_in(status, self.claimable_phases),
            or_(
                status == status_literal(Phase.PENDING),
                and_(
                    status == status_literal(Phase.UNFINISHED),
                    or_(table.c.not_before.is_(None), table.c.not_before <= now),
                ),
                and_(status == status_literal(Phase.WORKING), table.c.lease_expires_at < now),
            ),
        )

    def candidates(
        self, worker: WorkerTable, eligible: Select[Any], limit: int, now: ColumnElement[float]
    ) -> Select[Any]:
        """The eligible query rewritten to return claimable execution records, in its order."""
        table = worker.table
        return (
            eligible.with_only_columns(*claim_columns(table), maintain_column_froms=True)
            .where(table.c.source_id == worker.source_pk, self.claimable(table, now))
            .limit(limit)
        )

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        """Select and lock up to ``limit`` claimable records (old tokens).

        This version does not lock: it is only correct where the transaction already
        holds a database-wide write lock (SQLite's BEGIN IMMEDIATE). A database with row
        locks overrides it, skipping the records other transactions hold, and may return
        ``Claims.of(claims, skipped=n)`` to say how many it skipped.
        """
        rows = conn.execute(self.candidates(worker, eligible, limit, self.now())).all()
        return [Claim(*row) for row in rows]

    def claim(
        self,
        conn: Connection,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> list[Claim]:
        """Claim up to ``limit`` eligible records: each gets a new token and a lease."""
        if worker.limits is not None:
            return self.claim_limited(conn, worker, eligible, limit, lease_seconds, owner)
        if limit < 1:
            return []
        locked = self.lock_candidates(conn, worker, eligible, limit)
        skipped = locked.skipped if isinstance(locked, Claims) else 0
        if not locked:
            return Claims.of((), skipped)
        # One statement per count of keys, built once, on the driver's cursor.
        key = ("claim", worker.table, lease_seconds, owner, len(locked))
        statement = self._built_once(
            key, lambda: self._claim_update(worker.table, lease_seconds, owner, len(locked))
        )
        self._matched(conn, key, statement, by_position([c.source_id for c in locked]))
        # The caller decides on max_crashes from the claim, so report the count as
        # the UPDATE above stored it: the locked status is the one its CASE read.
        return Claims.of(
            (
                dataclasses.replace(
                    c,
                    token=c.token + 1,
                    attempts=c.attempts + 1,
                    crashes=c.crashes + (c.status == Phase.WORKING.value),
                    status=Phase.WORKING.value,
                )
                for c in locked
            ),
            skipped,
        )

    def claim_limited(
        self,
        conn: Connection,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> list[Claim]:
        """``claim`` for a worker with ``exclusive_by`` or ``rate_limit`` (``limited.py``):
        every dialect's ``claim`` sends such a worker here first."""
        return claim_limited(self, conn, worker, eligible, limit, lease_seconds, owner)

    def _row_lock(self, table: Table, count: int | None = None) -> Select[Any]:
        """Lock the records ``ids`` (or ``count`` of them, ``keys_in``) that are still
        claimable, skipping locked ones (SQLAlchemy drops FOR UPDATE on SQLite, whose
        claims hold the write lock)."""
        return (
            select(*claim_columns(table))
            .where(keys_in(table, count), self.claimable(table, self.now()))
            .with_for_update(skip_locked=True)
        )

    def _plan_search(self, search: Select[Any]) -> Select[Any]:
        """A limited claim's search as it runs (PostgreSQL plans it under its claim's
        plan settings, restored by the statement itself)."""
        return search

    def _plan_params(self, conn: Connection) -> dict[str, Any]:
        """Parameters ``_plan_search``'s statement needs, read just before it runs."""
        return {}

    def key_guard(self, worker: str, key: ColumnElement[str]) -> ColumnElement[bool] | None:
        """SQL the row lock of an ``exclusive_by`` claim adds, true for a row whose
        ``key`` no concurrent claim is about to take (None: no such guard; the claim
        meets such a race at the unique index)."""
        return None

    def update_in_order(self, statement: Any, order: ColumnElement[Any]) -> Any:
        """``statement`` (an UPDATE) writing its rows in ``order``, where the database
        can be told (a claim that writes several keys takes their unique-index entries
        in one order, so that two claims never wait for each other in a cycle), or None
        where it cannot be told (then the claim writes them one by one). This version
        leaves it unchanged: only a dialect with ``failed_statement_keeps_transaction``
        runs such a batch."""
        return statement

    def stored_key(self, key: ColumnElement[str]) -> ColumnElement[str]:
        """SQL: how a key's text is stored in ``held_key`` and the rate slots (their
        ``HELD_KEY_LENGTH`` columns). This version stores it whole: SQLite, which uses
        it, does not enforce VARCHAR lengths. A database that does stores a longer key
        as a fixed-length digest (``KEY_DIGEST_PREFIX`` + 64 hex digits of its SHA-256)."""
        return key

    def _claim_update(
        self, table: Table, lease_seconds: float, owner: Owner, count: int | None = None
    ) -> Any:
        """The UPDATE that claims the locked records ``ids`` (or ``count`` of them,
        ``keys_in``)."""
        return (
            update(table)
            .where(keys_in(table, count))
            .ordered_values(*self._claim_values(table, lease_seconds, owner))
        )

    def _claim_values(
        self, table: Table, lease_seconds: float, owner: Owner
    ) -> list[tuple[ColumnElement[Any], Any]]:
        """What a claim sets, in order (``claim_values``, from the CLAIM and TAKEOVER
        rows): every claim UPDATE (by ids, or a dialect's one statement over its own
        search) sets exactly these."""
        return claim_values(table, self.now(), lease_seconds, (owner.host, owner.pid))
