"""Reading: what operators, the public API and eligible queries read of the execution
records (a part of ``Dialect``). Plain SELECTs, the same on every database."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, Connection, exists, func, select

from ..core.status import ExecutionStatus, Phase
from .interface import DialectInterface
from .terms import WorkerTable, epoch_to_datetime, status_literal

#: The error type of a cancelled record (``dbworker.Cancelled``).
CANCELLED_TYPE = "dbworker.Cancelled"


class Reading(DialectInterface):
    """Statuses and records as the public API reports them (the token never shows)."""

    def status_condition(
        self, worker: WorkerTable, source_id: Any, statuses: Iterable[ExecutionStatus]
    ) -> ColumnElement[bool]:
        """A correlated EXISTS: does ``worker`` have one of ``statuses`` for ``source_id``?"""
        table = worker.table
        wanted = [ExecutionStatus(s).value for s in statuses]
        return exists().where(table.c.source_id == source_id, table.c.status.in_(wanted))

    def read_status(self, conn: Connection, worker: WorkerTable, source_id: Any) -> Phase | None:
        table = worker.table
        value = conn.execute(select(table.c.status).where(table.c.source_id == source_id)).scalar()
        return None if value is None else Phase(value)

    def read_state(
        self, conn: Connection, worker: WorkerTable, source_id: Any
    ) -> dict[str, Any] | None:
        table = worker.table
        row = conn.execute(select(table).where(table.c.source_id == source_id)).mappings().first()
        if row is None or row["status"] == Phase.PENDING.value:
            return None
        return {
            "execution_status": ExecutionStatus(row["status"]),
            "error": row["error"],
            "lease_expires_at": epoch_to_datetime(row["lease_expires_at"]),
            "error_type": row["error_type"],
            "traceback": row["traceback"],
            "attempts": row["attempts"],
            "failures": row["failures"],
            "crashes": row["crashes"],
            "not_before": epoch_to_datetime(row["not_before"]),
            "claimed_at": epoch_to_datetime(row["claimed_at"]),
            "finished_at": epoch_to_datetime(row["finished_at"]),
            "updated_at": epoch_to_datetime(row["updated_at"]),
            "owner": (
                None
                if row["owner_host"] is None
                else {"host": row["owner_host"], "pid": row["owner_pid"]}
            ),
        }

    def counts(self, conn: Connection, worker: WorkerTable) -> dict[Phase, int]:
        table = worker.table
        rows = conn.execute(select(table.c.status, func.count()).group_by(table.c.status)).all()
        return {Phase(status): int(n) for status, n in rows}

    def failed(
        self,
        conn: Connection,
        worker: WorkerTable,
        limit: int | None = None,
        *,
        tracebacks: bool = False,
    ) -> list[dict[str, Any]]:
        """FAILED records in key order, at most ``limit``; with their ``traceback``
        column when asked (it is long, so only a page of items wants it)."""
        table = worker.table
        columns = [
            table.c.source_id,
            table.c.error,
            table.c.error_type,
            table.c.attempts,
            table.c.crashes,
            table.c.updated_at,
        ]
        if tracebacks:
            columns.append(table.c.traceback)
        query = (
            select(*columns)
            .where(table.c.status == status_literal(Phase.FAILED))
            .order_by(table.c.source_id)
            .limit(limit)
        )
        return [
            {**row, "updated_at": epoch_to_datetime(row["updated_at"])}
            for row in conn.execute(query).mappings()
        ]

    def cancelled(
        self, conn: Connection, worker: WorkerTable, held: Iterable[tuple[Any, int]]
    ) -> list[Any]:
        """The ids among ``held`` (source id, token) that were cancelled under that
        token: FAILED with ``dbworker.Cancelled``, the token unchanged (a takeover would
        have issued a new one). One read, for the scheduler's check of what it holds."""
        tokens = dict(held)
        if not tokens:
            return []
        table = worker.table
        query = select(table.c.source_id, table.c.token).where(
            table.c.source_id.in_(list(tokens)),
            table.c.status == status_literal(Phase.FAILED),
            table.c.error_type == CANCELLED_TYPE,
        )
        rows = conn.execute(query).all()
        return [source_id for source_id, token in rows if tokens.get(source_id) == token]
