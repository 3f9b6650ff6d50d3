"""``Operations.schedules()`` against real tick rows on every database: each periodic
worker's last slot made, how its tick stands, and the next slot after the database's
now; the other workers left out."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from sqlalchemy import select

from dbworker import Coordinator, DBWorkerError, ExecutionStatus, ScheduleState, Tick
from dbworker.core.schedules import UTC, Schedule, to_microseconds
from dbworker.dialects import for_url

from . import app, periodic_app
from .support import Site

START = dt.datetime(2024, 5, 1, tzinfo=UTC)


def periodic(ops: Site) -> Coordinator:
    """The periodic workers, and a plain worker that ``schedules`` leaves out."""
    coordinator = ops.coordinator()
    coordinator.transactional_worker(name="jobs", source=app.Job)(app.run_job)
    periodic_app.register(coordinator)
    return coordinator


def add_ticks(ops: Site, worker: str, slots: list[dt.datetime]) -> None:
    with ops.session_factory.begin() as session:
        session.add_all(Tick(worker=worker, slot=to_microseconds(s)) for s in slots)


def db_now(ops: Site, coordinator: Coordinator) -> dt.datetime:
    with ops.engine.connect() as conn:
        seconds = conn.execute(select(for_url(coordinator.database_url).now())).scalar_one()
    return dt.datetime.fromtimestamp(float(seconds), UTC)


def next_slots(schedule: Schedule, before: dt.datetime, after: dt.datetime) -> set[dt.datetime]:
    """The next slot as seen at either end of the call (a slot may fall in between)."""
    return {schedule.next_after(before), schedule.next_after(after)}


def test_schedules_report_the_last_slot_its_status_and_the_next_slot(ops: Site) -> None:
    coordinator = periodic(ops)
    coordinator.create_worker_tables()
    hours = [START + periodic_app.HOURLY * i for i in range(3)]
    # Out of slot order: the last slot is the latest, not the last inserted.
    add_ticks(ops, "hourly", [hours[2], hours[0], hours[1]])
    nights = [START.replace(hour=2, minute=30), START.replace(hour=2, minute=30) + dt.timedelta(1)]
    add_ticks(ops, "nightly", nights)
    report = coordinator.drain()
    assert report.counts()["hourly"] == {"finished": 3}
    assert report.counts()["nightly"] == {"failed": 2}

    before = db_now(ops, coordinator)
    found = coordinator.operations.schedules()
    after = db_now(ops, coordinator)
    assert [s.worker for s in found] == ["hourly", "nightly", "minutely"]
    hourly, nightly, minutely = found

    with ops.session_factory() as session:
        last_hour = session.scalar(
            select(Tick.id).where(Tick.worker == "hourly", Tick.slot == to_microseconds(hours[2]))
        )
    every = Schedule.of(every=periodic_app.HOURLY)
    assert hourly.next_slot in next_slots(every, before, after)
    assert hourly == ScheduleState(
        worker="hourly",
        schedule="every 1:00:00",
        timezone="UTC",
        catch_up="latest",
        last_slot=hours[2],
        last_tick=last_hour,
        last_status=ExecutionStatus.FINISHED,
        next_slot=hourly.next_slot,
    )
    assert hourly.last_slot is not None and hourly.last_slot.tzinfo is UTC

    assert nightly.schedule == f"cron '{periodic_app.NIGHTLY}' ({periodic_app.BERLIN})"
    assert (nightly.timezone, nightly.catch_up) == (periodic_app.BERLIN, "none")
    assert (nightly.last_slot, nightly.last_status) == (nights[1], ExecutionStatus.FAILED)
    berlin = zoneinfo.ZoneInfo(periodic_app.BERLIN)
    cron = Schedule.of(cron=periodic_app.NIGHTLY, timezone=periodic_app.BERLIN)
    assert nightly.next_slot in next_slots(cron, before, after)
    assert nightly.next_slot.tzinfo is UTC and before < nightly.next_slot
    assert nightly.next_slot.astimezone(berlin).time() == dt.time(4, 30)

    # Never ticked: nothing made, the next slot still known.
    assert (minutely.last_slot, minutely.last_tick, minutely.last_status) == (None, None, None)
    assert minutely.catch_up == "all"
    assert before < minutely.next_slot <= after + dt.timedelta(minutes=1)
    assert minutely.next_slot.second == 0 and minutely.next_slot.microsecond == 0

    # A tick made after the last drain: the latest slot, not claimed (no status) yet.
    add_ticks(ops, "hourly", [hours[2] + periodic_app.HOURLY])
    newest = coordinator.operations.schedules()[0]
    assert newest.last_slot == hours[2] + periodic_app.HOURLY
    assert newest.last_tick is not None and last_hour is not None
    assert newest.last_tick > last_hour
    assert newest.last_status is None


def test_without_periodic_workers_nothing_is_read(ops: Site) -> None:
    coordinator = ops.coordinator()
    coordinator.transactional_worker(name="jobs", source=app.Job)(app.run_job)
    # No table exists at all: an empty list, not an error.
    assert coordinator.operations.schedules() == []


@pytest.mark.backends("sqlite")
def test_missing_tables_are_named(ops: Site) -> None:
    coordinator = periodic(ops)
    with pytest.raises(DBWorkerError, match="dbworker_hourly, dbworker_nightly"):
        coordinator.operations.schedules()
    for worker in coordinator.workers.values():
        worker.execution_table.create(ops.engine)
    with pytest.raises(DBWorkerError, match="dbworker_ticks of the periodic workers"):
        coordinator.operations.schedules()
