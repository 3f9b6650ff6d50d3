"""``dbworker schedules``, run as a subprocess against every database: the ticks are
made and run in the test process (``drain()`` on a twin coordinator), as
``test_cli`` does for the other commands."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from dbworker.operator.schedule_display import slot_text

from . import periodic_app
from .support import Site
from .test_cli import REFERENCE, dbworker, ok, table_rows
from .test_schedules import START, add_ticks, periodic

SCHEDULES_REFERENCE = __package__ + ".schedules_cli_app:coordinator"


def test_schedules_lists_last_and_next_slots(ops: Site) -> None:
    coordinator = periodic(ops)
    coordinator.create_worker_tables()
    add_ticks(ops, "hourly", [START, START + periodic_app.HOURLY])
    add_ticks(ops, "nightly", [START.replace(hour=2, minute=30)])
    coordinator.drain()
    add_ticks(ops, "hourly", [START + 2 * periodic_app.HOURLY])  # made, not claimed yet
    expected = coordinator.operations.schedules()

    found = json.loads(
        ok(dbworker(ops.url, "schedules", SCHEDULES_REFERENCE, "--json", cwd=ops.workdir))
    )
    assert [item["worker"] for item in found] == ["hourly", "nightly", "minutely"]
    hourly, nightly, minutely = found
    assert hourly == {
        "worker": "hourly",
        "schedule": "every 1:00:00",
        "timezone": "UTC",
        "catch_up": "latest",
        "last_slot": "2024-05-01T02:00:00+00:00",
        "last_tick": expected[0].last_tick,
        "last_status": "pending",
        "next_slot": hourly["next_slot"],
    }
    # The next slot is on the schedule and after the database's now, as the API says.
    next_hour = dt.datetime.fromisoformat(hourly["next_slot"])
    assert next_hour.tzinfo is not None and next_hour >= expected[0].next_slot
    assert next_hour.minute == next_hour.second == 0
    assert nightly["last_status"] == "failed"
    assert nightly["last_slot"] == "2024-05-01T02:30:00+00:00"
    assert nightly["schedule"] == "cron '30 4 * * *' (Europe/Berlin)"
    assert (minutely["last_slot"], minutely["last_tick"], minutely["last_status"]) == (
        None,
        None,
        None,
    )

    human = ok(dbworker(ops.url, "schedules", SCHEDULES_REFERENCE, cwd=ops.workdir))
    lines = human.strip().splitlines()
    assert lines[0].split() == [
        "worker",
        "schedule",
        "catch_up",
        "last_slot",
        "status",
        "next_slot",
    ]
    assert lines[-1] == "times in UTC, on the database's clock"
    rows = {row[0]: row for row in table_rows("\n".join(lines[:-1]))}
    assert set(rows) == {"hourly", "nightly", "minutely"}
    # worker, "every", "1:00:00", catch_up, last slot (date, time), status, next slot.
    assert rows["hourly"][:7] == [
        "hourly", "every", "1:00:00", "latest", "2024-05-01", "02:00:00Z", "pending"
    ]  # fmt: skip
    assert rows["nightly"][-5:-2] == ["2024-05-01", "02:30:00Z", "failed"]
    assert rows["minutely"][-5:-2] == ["all", "-", "-"]
    assert all(row[-1].endswith(":00Z") for row in rows.values())


# Before any backend-specific work: one backend is enough.
@pytest.mark.backends("sqlite")
def test_schedules_without_periodic_workers_or_tables(ops: Site) -> None:
    none = ok(dbworker(ops.url, "schedules", REFERENCE, cwd=ops.workdir))
    assert none.strip() == "no periodic workers registered"
    assert (
        json.loads(ok(dbworker(ops.url, "schedules", REFERENCE, "--json", cwd=ops.workdir))) == []
    )
    missing = dbworker(ops.url, "schedules", SCHEDULES_REFERENCE, cwd=ops.workdir)
    assert missing.returncode == 1
    assert "do not exist yet" in missing.stderr and "create-tables" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_slots_print_in_utc() -> None:
    berlin = dt.datetime(2024, 5, 1, 6, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert slot_text(berlin) == "2024-05-01 04:30:00Z"
    assert slot_text(berlin.replace(microsecond=500_000)) == "2024-05-01 04:30:00.500000Z"
    assert slot_text(None) == "-"
