"""Periodic workers of the operations tests (``schedules``): handlers at module scope,
and the registration the tests and ``schedules_cli_app`` share.

``hourly`` finishes its ticks, ``nightly`` (a cron schedule read in Berlin) fails
them, ``minutely`` never gets a tick: each ``ScheduleState`` shape is there.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy.orm import Session

from dbworker import Coordinator, Finished, Tick

HOURLY = dt.timedelta(hours=1)
NIGHTLY = "30 4 * * *"  # 04:30 exists every day: no daylight saving gap to step over
BERLIN = "Europe/Berlin"


def finish(tick: Tick, session: Session) -> Finished:
    return Finished()


def fail(tick: Tick, session: Session) -> Finished:
    raise ValueError(f"tick {tick.id} failed")


def register(coordinator: Coordinator) -> None:
    coordinator.periodic_worker("hourly", every=HOURLY)(finish)
    coordinator.periodic_worker("nightly", cron=NIGHTLY, timezone=BERLIN, catch_up="none")(fail)
    coordinator.periodic_worker("minutely", cron="* * * * *", catch_up="all")(finish)
