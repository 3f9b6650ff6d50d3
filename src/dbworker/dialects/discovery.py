"""Discovery: the shared SQL that turns new source rows into pending records, and the
idle poll's probe (a part of ``Dialect``).

A database overrides ``_discover_above_watermark`` where it can move the new keys into
records in one statement (``_discover_in_one_insert``, or a statement of its own), so
that they never travel to the coordinator and back as parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Select,
    Table,
    bindparam,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
)

from ..core.status import OPEN, Phase
from .interface import DialectInterface
from .terms import PENDING_COLUMNS, WorkerTable, status_in, status_literal

#: Where discovery in one round trip starts when no record exists yet: the smallest
#: BIGINT, below every other integer key (a source row with this very key is left to the
#: sweeps, which look at every key).
LOWEST_KEY = -(2**63)


class Discovery(DialectInterface):
    """New source rows above the watermark (``discover``), below it (``sweep``), and
    whether a poll may find anything (``probe``)."""

    def discover(self, conn: Connection, worker: WorkerTable) -> int:
        """Add pending records for source rows newer than any the table knows.

        The watermark is the largest known source id (an index lookup), so an idle
        poll costs the same with a million finished rows as with none. Rows whose
        inserts commit out of key order land below the watermark; ``sweep`` finds them.
        """
        if not worker.monotonic_keys:
            return self.sweep(conn, worker)
        return self._discover_above_watermark(conn, worker)[0]

    def discover_to_watermark(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        """``discover``, and the watermark after it.

        The watermark comes from what discovery itself read (the largest known key, or
        the largest key it added) rather than from a second ``max()``: a woken poll
        costs a round trip less. Another coordinator may have added larger keys
        meanwhile; a watermark that is low only makes later sweeps look further back.
        A dialect whose ``discover`` is its own (``supports_discovery_watermark`` is
        False) keeps it, followed by that read.
        """
        if not self.supports_discovery_watermark or not worker.monotonic_keys:
            return self.discover(conn, worker), self.watermark(conn, worker)
        return self._discover_above_watermark(conn, worker)

    def discover_for_claim(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        """``discover_to_watermark`` in the transaction of a claim that follows it at
        once, which a dialect may prepare in discovery's statement
        (``prepares_claim_in_discovery``)."""
        return self.discover_to_watermark(conn, worker)

    def _discover_above_watermark(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        pk = worker.source_pk
        watermark = self.watermark(conn, worker)
        query = self._above_watermark(worker, watermark is not None, pk, self.now())
        rows = conn.execute(query, {"watermark": watermark}).all()
        added = self._add_pending(conn, worker, rows)
        # In key order and above the old watermark: the last is the largest known now.
        return added, rows[-1][0] if rows else watermark

    def _above_watermark(
        self, worker: WorkerTable, above: bool, *columns: ColumnElement[Any]
    ) -> Select[Any]:
        """``columns`` of one batch of source rows in key order, above the ``watermark``
        parameter when ``above``."""
        pk = worker.source_pk
        query = worker.own(select(*columns).order_by(pk).limit(self.discovery_batch))
        return query.where(pk > bindparam("watermark", type_=pk.type)) if above else query

    def _pending_values(self, source_id: ColumnElement[Any]) -> list[ColumnElement[Any]]:
        """A new pending record for ``source_id`` as SQL, column by column
        (``PENDING_COLUMNS``): for discovery in one statement."""
        now = self.now()
        return [source_id, status_literal(Phase.PENDING), *[literal_column("0")] * 4, now, now]

    def _discovery_round(
        self, conn: Connection, worker: WorkerTable, build: Callable[[bool], Any]
    ) -> tuple[int, Any]:
        """Run a dialect's one-statement discovery, ``build(above)`` (built once per table
        and whether a watermark bounds it): the rows it matched, and the watermark it
        started from."""
        watermark = self.watermark(conn, worker)
        above = watermark is not None
        key = ("discover", worker.table, above)
        statement = self._built_once(key, lambda: build(above))
        return self._matched(conn, key, statement, {"watermark": watermark}), watermark

    def _discover_in_one_insert(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        """Discovery as one ``INSERT ... SELECT`` from the source table (``insert_ignore``
        leaves keys another coordinator added): the records added, and the watermark."""
        if self.watermark_read_in_insert and conn.dialect.insert_returning:
            return self._discover_returning(conn, worker)

        returning = self.discovery_returns_keys and conn.dialect.insert_returning

        def build(above: bool) -> Any:
            rows = self._above_watermark(worker, above, *self._pending_values(worker.source_pk))
            statement = self.insert_ignore(worker.table).from_select(PENDING_COLUMNS, rows)
            return statement.returning(worker.table.c.source_id) if returning else statement

        if returning:
            return self._discover_keys(conn, worker, build)
        added, watermark = self._discovery_round(conn, worker, build)
        return added, self.watermark(conn, worker) if added else watermark

    def _discover_keys(
        self, conn: Connection, worker: WorkerTable, build: Callable[[bool], Any]
    ) -> tuple[int, Any]:
        """``_discovery_round`` of a statement that returns the keys it added (and, as
        its affected rows counted them, those another coordinator added meanwhile): the
        largest is the new watermark, without a second read."""
        watermark = self.watermark(conn, worker)
        above = watermark is not None
        key = ("discover_keys", worker.table, above)
        statement = self._built_once(key, lambda: build(above))
        keys = [row[0] for row in self._rows_of(conn, key, statement, {"watermark": watermark})]
        return (len(keys), max(keys)) if keys else (0, watermark)

    def _discover_returning(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        """``_discover_in_one_insert`` in one statement: the INSERT reads the watermark
        itself and returns the keys it stored, the largest of which is the new one. New
        rows cost one statement, not three (read the watermark, insert, read it again);
        a discovery that finds nothing reads the watermark after it."""
        statement = self._built_once(
            ("discover_returning", worker.table), lambda: self._discovery_returning(worker)
        )
        keys = [row[0] for row in self._rows_of(conn, statement, statement, {})]
        return (len(keys), max(keys)) if keys else (0, self.watermark(conn, worker))

    def _discovery_returning(self, worker: WorkerTable) -> Any:
        table, pk = worker.table, worker.source_pk
        newest = select(func.max(table.c.source_id)).scalar_subquery()
        # Above the watermark, or above LOWEST_KEY when there is none: a bound that
        # names no source column is evaluated once, so the search stays an ordered walk
        # of the key from there ("newest IS NULL OR ..." would filter every key).
        above = func.coalesce(newest, literal(LOWEST_KEY, BigInteger()))
        rows = self._above_watermark(worker, False, *self._pending_values(pk)).where(pk > above)
        return (
            self.insert_ignore(table)
            .from_select(PENDING_COLUMNS, rows)
            .returning(table.c.source_id)
        )

    def sweep(self, conn: Connection, worker: WorkerTable, above: Any = None) -> int:
        """Add pending records for every source row (above ``above``) that has none."""
        table, pk = worker.table, worker.source_pk
        query = worker.own(select(pk, self.now()).order_by(pk).limit(self.discovery_batch))
        if above is None:
            query = query.where(~exists().where(table.c.source_id == pk))
        else:
            # The bound on source_id repeats pk > above for the planner: PostgreSQL does
            # not carry it across the join, and merge-joins the whole history otherwise.
            query = query.where(pk > above).where(
                ~exists().where(table.c.source_id == pk, table.c.source_id > above)
            )
        return self._add_pending(conn, worker, conn.execute(query).all())

    def probe(self, conn: Connection, worker: WorkerTable, above: Any) -> bool:
        """Whether a poll may find anything: a source row above ``above`` (the
        watermark), or any open record. Two index probes in one statement (the end of
        the primary key, the first open record), so an idle poll reads next to nothing."""
        table, pk = worker.table, worker.source_pk
        # max(), not EXISTS(pk > above): every planner answers max() of an indexed
        # column from the index's end, while a never-analyzed PostgreSQL table gets a
        # sequential scan for the EXISTS (and reads it all when nothing is newer).
        newest = worker.own(select(func.max(pk))).scalar_subquery()
        statement = select(
            or_(
                newest > bindparam("above", type_=pk.type),
                exists().where(status_in(table.c.status, OPEN)),
            )
        )
        return bool(conn.execute(statement, {"above": above}).scalar())

    def insert_ticks(
        self, conn: Connection, ticks: Table, worker: str, slots: Sequence[int]
    ) -> None:
        """Make ``slots`` (microseconds since the epoch) of periodic worker ``worker`` into
        rows of ``ticks``: each becomes one row however many coordinators insert it, as
        the insert skips the slots its unique (worker, slot) already holds."""
        if slots:
            statement = self.insert_ignore(ticks, ("worker", "slot"))
            conn.execute(statement, [{"worker": worker, "slot": slot} for slot in slots])

    def watermark(self, conn: Connection, worker: WorkerTable) -> Any:
        table = worker.table
        key = ("watermark", table)
        statement = self._built_once(key, lambda: select(func.max(table.c.source_id)))
        return self._rows_of(conn, key, statement, {})[0][0]

    def _add_pending(self, conn: Connection, worker: WorkerTable, rows: Sequence[Any]) -> int:
        if not rows:
            return 0
        pending = (Phase.PENDING.value, 0, 0, 0, 0)
        values = [
            dict(zip(PENDING_COLUMNS, (source_id, *pending, float(now), float(now)), strict=True))
            for source_id, now in rows
        ]
        # One statement built once, many parameter sets: SQLAlchemy sends them as
        # multi-row INSERTs without compiling a statement for every batch.
        statement = self._built_once(
            ("insert_pending", worker.table), lambda: self.insert_ignore(worker.table)
        )
        conn.execute(statement, values)
        return len(values)
