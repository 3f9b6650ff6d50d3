"""PostgreSQL: row locks with SKIP LOCKED in the claiming query itself."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Connection, Float, Select, Table, cast, extract, func
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert

from .base import Claim, Dialect, WorkerTable

# SQLSTATEs worth retrying: serialization failure, deadlock, lock not available,
# admin shutdown / crash shutdown / cannot connect now (a restarting server).
_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57P01", "57P02", "57P03"})


class PostgreSQLDialect(Dialect):
    backend_names: ClassVar[tuple[str, ...]] = ("postgresql",)
    supports_skip_locked: ClassVar[bool] = True

    def db_now(self) -> ColumnElement[float]:
        # clock_timestamp(), not now(): now() is frozen at transaction start, and a
        # lease must be measured from when the statement really ran.
        return cast(extract("epoch", func.clock_timestamp()), Float())

    def insert_ignore(self, table: Table) -> Insert:
        return pg_insert(table).on_conflict_do_nothing(index_elements=["source_id"])

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
