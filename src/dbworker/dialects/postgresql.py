"""PostgreSQL: row locks with SKIP LOCKED in the claiming query itself."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Select,
    Table,
    cast,
    extract,
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert

from .base import Claim, Dialect, WorkerTable, claim_columns
from .open_first import apply_modifiers, in_direction, key_direction, plain_shape, split_order

# SQLSTATEs worth retrying: serialization failure, deadlock, lock not available,
# admin shutdown / crash shutdown / cannot connect now (a restarting server).
_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57P01", "57P02", "57P03"})


class PostgreSQLDialect(Dialect):
    backend_names: ClassVar[tuple[str, ...]] = ("postgresql",)
    default_port: ClassVar[int | None] = 5432
    # Each connection is a new backend process, whose catalog caches start empty.
    new_connection_is_cold: ClassVar[bool] = True
    # libpq's client state is plain memory a fork copies; DISCARD ALL resets the rest.
    sessions_outlive_processes: ClassVar[bool] = True

    def db_now(self) -> ColumnElement[float]:
        # clock_timestamp(), not now(): now() is frozen at transaction start, and a
        # lease must be measured from when the statement really ran.
        return cast(extract("epoch", func.clock_timestamp()), Float())

    def reset_session(self, conn: Connection) -> None:
        # Settings, prepared statements, temporary tables, advisory locks, LISTENs:
        # what one handler left must not reach the next. Not allowed in a transaction.
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("DISCARD ALL")

    def insert_ignore(self, table: Table) -> Insert:
        return pg_insert(table).on_conflict_do_nothing(index_elements=["source_id"])

    def candidates(
        self, worker: WorkerTable, eligible: Select[Any], limit: int, now: ColumnElement[float]
    ) -> Select[Any]:
        # PostgreSQL has no join hints, and with a backlog or stale statistics it walks
        # or merge-joins the whole history in ORDER BY order. A LATERAL subquery with
        # OFFSET 0 cannot be flattened, so the open records are read first and each is
        # looked up in the eligible query; its ORDER BY expressions come back as columns.
        terms = [split_order(term) for term in eligible._order_by_clauses]
        checked = [term for term in terms if term is not None]
        if not plain_shape(eligible) or len(checked) < len(terms):
            return super().candidates(worker, eligible, limit, now)
        table = worker.table
        direction = key_direction(eligible, worker)
        labels: list[ColumnElement[Any]] = []
        if direction is None:
            labels = [
                element.label(f"dbworker_order_{i}") for i, (element, _) in enumerate(checked)
            ]
        lookup = (
            eligible.with_only_columns(*labels or [literal_column("1")], maintain_column_froms=True)
            .where(worker.source_pk == table.c.source_id)
            .order_by(None)
            .offset(0)
            .lateral("dbworker_eligible")
        )
        if direction is not None:
            order = [in_direction(table.c.source_id, direction)]
        else:
            order = [
                apply_modifiers(lookup.c[f"dbworker_order_{i}"], modifiers)
                for i, (_, modifiers) in enumerate(checked)
            ]
        return (
            select(*claim_columns(table))
            .select_from(table)
            .join(lookup, true())
            .where(self.claimable(table, now))
            .order_by(*order)
            .limit(limit)
        )

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        # FOR UPDATE OF <execution table> SKIP LOCKED inside the ordered scan: a
        # second claimer walks past rows the first holds and takes the next ones,
        # and the application's own rows are never locked.
        query = self.candidates(worker, eligible, limit, self.now()).with_for_update(
            of=worker.table, skip_locked=True
        )
        return [Claim(*row) for row in conn.execute(query).all()]

    def is_transient(self, error: BaseException) -> bool:
        sqlstate = getattr(getattr(error, "orig", None), "sqlstate", None)
        return sqlstate in _TRANSIENT_SQLSTATES or super().is_transient(error)
