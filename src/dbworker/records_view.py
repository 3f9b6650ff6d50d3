"""One execution record as operators read it (``dbworker show``, the dashboard): every
stored field but the token, times as UTC datetimes, and its history as a timeline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select

from .dialects.base import epoch_to_datetime

if TYPE_CHECKING:
    from .coordinator import Coordinator
    from .worker import Registration

_TIMES = (
    "discovered_at",
    "claimed_at",
    "not_before",
    "lease_expires_at",
    "finished_at",
    "updated_at",
)


def item_record(
    coordinator: Coordinator, conn: Connection, worker: Registration, source_id: Any
) -> dict[str, Any] | None:
    """The record of ``source_id`` (None if the worker has none); ``status`` is
    ``pending`` for a row discovered but never claimed."""
    table = worker.table.table
    row = conn.execute(select(table).where(table.c.source_id == source_id)).mappings().first()
    if row is None:
        return None
    owner = None if row["owner_host"] is None else f"{row['owner_host']} pid {row['owner_pid']}"
    record: dict[str, Any] = {
        "worker": worker.name,
        "source_id": row["source_id"],
        "status": row["status"],
        "attempts": row["attempts"],
        "failures": row["failures"],
        "crashes": row["crashes"],
        "owner": owner,
        **{name: epoch_to_datetime(row[name]) for name in _TIMES},
        "error_type": row["error_type"],
        "error": row["error"],
        "traceback": row["traceback"],
    }
    return record


def history(record: dict[str, Any]) -> list[tuple[Any, str]]:
    """The record's story from its timestamps, oldest first: what it keeps of the past
    (each record keeps the latest claim and ending; the counters say how many came before)."""
    events: list[tuple[Any, str]] = []
    if record["discovered_at"] is not None:
        events.append((record["discovered_at"], "discovered (pending)"))
    if record["claimed_at"] is not None:
        previous = record["attempts"] - 1
        before = f" after {previous} earlier attempt(s)" if previous > 0 else ""
        who = f" by {record['owner']}" if record["owner"] else ""
        events.append((record["claimed_at"], f"claimed, attempt {record['attempts']}{who}{before}"))
    status = record["status"]
    if status == "finished" and record["finished_at"] is not None:
        events.append((record["finished_at"], "finished"))
    elif status in ("failed", "unfinished") and record["updated_at"] is not None:
        what = "failed" if status == "failed" else "unfinished"
        if record["error"]:
            what += f": {record['error'].splitlines()[0]}"
        events.append((record["updated_at"], what))
    if status == "unfinished" and record["not_before"] is not None:
        events.append((record["not_before"], "due again"))
    if status == "working" and record["lease_expires_at"] is not None:
        events.append((record["lease_expires_at"], "lease runs out unless renewed"))
    return sorted(events, key=lambda item: item[0])
