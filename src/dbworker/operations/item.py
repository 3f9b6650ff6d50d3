"""One execution record as operators read it: every stored field but the token, times
as UTC datetimes (``dbworker show``, the dashboard's item page)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from ..dialects.base import epoch_to_datetime
from ..worker import Registration
from .results import ItemRecord


def read_item(conn: Connection, worker: Registration, source_id: Any) -> ItemRecord | None:
    """The record of ``source_id`` (None if the worker has none), pending ones too,
    which ``Dialect.read_state`` leaves out, with when they were discovered."""
    table = worker.table.table
    row = conn.execute(select(table).where(table.c.source_id == source_id)).mappings().first()
    if row is None:
        return None
    return ItemRecord(
        worker=worker.name,
        source_id=row["source_id"],
        status=row["status"],
        attempts=row["attempts"],
        failures=row["failures"],
        crashes=row["crashes"],
        owner=(
            None
            if row["owner_host"] is None
            else {"host": row["owner_host"], "pid": row["owner_pid"]}
        ),
        discovered_at=epoch_to_datetime(row["discovered_at"]),
        claimed_at=epoch_to_datetime(row["claimed_at"]),
        not_before=epoch_to_datetime(row["not_before"]),
        lease_expires_at=epoch_to_datetime(row["lease_expires_at"]),
        finished_at=epoch_to_datetime(row["finished_at"]),
        updated_at=epoch_to_datetime(row["updated_at"]),
        error_type=row["error_type"],
        error=row["error"],
        traceback=row["traceback"],
    )
