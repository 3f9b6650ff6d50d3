"""What a worker's work looks like from the database: the backlog that tells the truth.

``measure`` answers, per worker, on the database's clock:

- ``waiting``: source rows that match ``eligible`` now and are not claimed: rows with
  no record yet (not discovered, e.g. inserted while no coordinator ran) and records
  that a claim could take now (pending, unfinished and due, or a lease run out);
- ``oldest_waiting_seconds``: the age of the oldest of those, from the source's
  timestamp column when it has one (``created_at`` and the like), else from its
  record (discovered, or due again), which undiscovered rows do not have yet;
- ``running``: records held under a live lease;
- ``finished_last_minute`` and the per-minute history of the last hour.

The waiting count reads the whole eligible set and the history reads every record
finished in the last hour, so with a large table these are the expensive figures:
coordinators refresh them into the registry (``dbworker.registry``) and the CLI and
dashboard show those with their age, computing them here only when nobody has.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, DateTime, and_, func, or_, select

from .core.status import Phase
from .dialects import Dialect
from .schema import has_table
from .worker import Registration

#: Source columns taken to be the row's creation time, in order of preference.
TIMESTAMP_NAMES = ("created_at", "inserted_at", "submitted_at", "enqueued_at", "created")
#: The throughput history: this many minutes back.
HISTORY_MINUTES = 60


def timestamp_column(worker: Registration) -> Any:
    """The source's creation-time column, or None."""
    columns = worker.table.source_pk.table.columns
    for name in TIMESTAMP_NAMES:
        column = columns.get(name)
        if column is not None and isinstance(column.type, DateTime):
            return column
    return None


def db_now(conn: Connection, dialect: Dialect) -> float:
    """The database's clock (or the dialect's test clock), in epoch seconds."""
    return float(conn.execute(select(dialect.now())).scalar_one())


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        # A naive timestamp is taken as UTC, as the database's clock is read in UTC.
        moment: dt.datetime = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return moment.timestamp()
    if isinstance(value, str):  # SQLite hands back text for some expressions
        parsed: float | None = _epoch(dt.datetime.fromisoformat(value))
        return parsed
    return float(value)


def waiting(
    conn: Connection, dialect: Dialect, worker: Registration, now: float
) -> tuple[int, Any]:
    """(rows eligible and not claimed, the oldest one's time in epoch seconds or None)."""
    query = worker.eligible_query()
    # The order does not change a count; a LIMIT does, and then the order matters.
    if query._limit_clause is None and query._offset_clause is None:
        query = query.order_by(None)
    eligible = query.subquery("dbworker_eligible")
    key = eligible.c[worker.table.source_pk.name]
    table = worker.table.table
    stamp = timestamp_column(worker)
    oldest = (
        func.min(eligible.c[stamp.name])
        if stamp is not None
        else func.min(func.coalesce(table.c.not_before, table.c.discovered_at))
    )
    statement = (
        select(func.count(), oldest)
        .select_from(eligible.outerjoin(table, table.c.source_id == key))
        .where(or_(table.c.source_id.is_(None), dialect.claimable(table, dialect.now())))
    )
    count, first = conn.execute(statement).one()
    return int(count), _epoch(first)


def measure(conn: Connection, dialect: Dialect, worker: Registration) -> dict[str, Any]:
    """The figures above for one worker, as JSON-ready values. Without its source
    table (not created yet) nothing can be waiting: ``waiting`` is None then."""
    now = db_now(conn, dialect)
    table = worker.table.table
    source = worker.table.source_pk.table
    count: int | None
    count, first = waiting(conn, dialect, worker, now) if has_table(conn, source) else (None, None)
    start = now - HISTORY_MINUTES * 60
    bucket = dialect.whole_minutes(table.c.finished_at - start)
    history_rows = conn.execute(
        select(bucket, func.count())
        .where(table.c.status == Phase.FINISHED.value, table.c.finished_at >= start)
        .group_by(bucket)
    ).all()
    history = [0] * HISTORY_MINUTES
    for minute, n in history_rows:
        if minute is not None and 0 <= int(minute) < HISTORY_MINUTES:
            history[int(minute)] += int(n)
    last_minute = conn.execute(
        select(func.count()).where(
            table.c.status == Phase.FINISHED.value, table.c.finished_at >= now - 60
        )
    ).scalar_one()
    running = conn.execute(
        select(func.count()).where(
            and_(table.c.status == Phase.WORKING.value, table.c.lease_expires_at >= now)
        )
    ).scalar_one()
    counts = {phase.value: n for phase, n in dialect.counts(conn, worker.table).items()}
    return {
        "waiting": count,
        "oldest_waiting_seconds": None if first is None else max(0.0, now - first),
        "running": int(running),
        "finished_last_minute": int(last_minute),
        "history": history,
        "counts": counts,
        "measured_at": now,
    }
