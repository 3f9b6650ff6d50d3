"""Each periodic worker's schedule as operators read it: the last slot made, how its
tick stands, and the next slot (``Operations.schedules``, ``dbworker schedules``, the
dashboard's index page)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from sqlalchemy import Connection, Table, select

from ..core.errors import DBWorkerError
from ..core.schedules import UTC, from_microseconds
from ..core.status import ExecutionStatus
from ..dialects import Dialect
from ..registry import has_table
from ..worker import Registration


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleState:
    """One periodic worker's schedule and where it stands, on the database's clock."""

    worker: str
    #: The schedule as text: ``cron '0 3 * * *' (Europe/Berlin)`` or ``every 0:05:00``.
    schedule: str
    #: The IANA timezone its cron expression is read in.
    timezone: str
    #: Its catch-up policy: ``"latest"``, ``"all"`` or ``"none"``.
    catch_up: str
    #: The latest slot any coordinator made into a tick (UTC), None before the first.
    last_slot: dt.datetime | None
    #: That tick's id: the source id of its execution record.
    last_tick: int | None
    #: That tick's execution status; None when there is no tick or it is not claimed
    #: yet (as ``Worker.status``).
    last_status: ExecutionStatus | None
    #: The first slot after the database's now (UTC).
    next_slot: dt.datetime


def read_schedules(
    conn: Connection, dialect: Dialect, ticks: Table, workers: Sequence[Registration]
) -> list[ScheduleState]:
    """The state of each periodic worker of ``workers`` (their ticks in ``ticks``, the
    table ``WorkerTables.ticks()`` names), in their order: a read of the clock, then
    per worker two index lookups (its latest tick through the unique (worker, slot)
    index, that tick's record by key), however many ticks it made."""
    if not has_table(conn, ticks):
        raise DBWorkerError(
            f"the table {ticks.name} of the periodic workers does not exist yet: run "
            "`dbworker create-tables` (or your migrations) first"
        )
    # The database's clock, as the ticker reads it: "next" means the same on every host.
    seconds = float(conn.execute(select(dialect.now())).scalar_one())
    now = dt.datetime.fromtimestamp(seconds, UTC)
    found = []
    for worker in workers:
        schedule = worker.schedule
        if schedule is None:
            continue
        latest = conn.execute(
            select(ticks.c.id, ticks.c.slot)
            .where(ticks.c.worker == worker.name)
            .order_by(ticks.c.slot.desc())
            .limit(1)
        ).first()
        status = None
        if latest is not None:
            phase = dialect.read_status(conn, worker.table, latest.id)
            status = None if phase is None else phase.public
        found.append(
            ScheduleState(
                worker=worker.name,
                schedule=schedule.describe(),
                timezone=schedule.timezone,
                catch_up=schedule.catch_up.value,
                last_slot=None if latest is None else from_microseconds(int(latest.slot)),
                last_tick=None if latest is None else int(latest.id),
                last_status=status,
                next_slot=schedule.next_after(now),
            )
        )
    return found
