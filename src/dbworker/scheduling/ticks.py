"""Making periodic workers' ticks: each slot of a schedule inserted as a ``Tick`` row.

Every coordinator that runs a periodic worker inserts its slots, and the ticks table's
unique (worker, slot) keeps one row per slot (``Dialect.insert_ticks``): no leader, so
no election to lose and no slot lost while one is held. Time is the database's clock,
one for every host: each insert reads it, and between inserts the loop wakes at the
next slot by the offset of that clock from this host's, as last read.

At its first insert a coordinator makes what the schedule's catch-up policy says of
the slots nobody made while every coordinator was down (``Schedule.missed``, from the
latest slot in the table); from then on, every slot in (made up to, now]. A slot is
only counted made once its transaction commits, so a database outage defers the
insert (the outbox's ``Deferred``) and the slots are inserted when it is back: none
that fell while this coordinator was up is skipped.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, func, select

from ..core.schedules import UTC, Schedule, from_microseconds, to_microseconds
from ..dialects import Dialect
from ..schema import TICKS, Tick
from .outbox import Deferred, Outbox
from .state import WorkerState

log = logging.getLogger("dbworker")


@dataclass(slots=True)
class Periodic:
    """One periodic worker's schedule and how far this coordinator has made it."""

    state: WorkerState
    schedule: Schedule
    #: Every slot up to this one is made; None before the first insert (catch-up).
    made_up_to: dt.datetime | None = None

    @property
    def name(self) -> str:
        return self.state.worker.name


@dataclass(frozen=True, slots=True)
class _Made:
    """What one insert made: up to when, and each worker's new slots."""

    now: dt.datetime
    slots: list[tuple[Periodic, list[dt.datetime], int]]


class Ticker:
    """The scheduler's tick maker: ``make`` when ``due``, each pass of its loop."""

    def __init__(self, outbox: Outbox, dialect: Dialect, states: Iterable[WorkerState]) -> None:
        self.outbox = outbox
        self.dialect = dialect
        self.periodic = [
            Periodic(state, state.worker.schedule)
            for state in states
            if state.worker.schedule is not None
        ]
        #: The database's clock minus this host's (``time.time()``), as last read.
        self.offset = 0.0
        #: When (``time.monotonic()``) to insert next; None without periodic workers.
        self.due: float | None = 0.0 if self.periodic else None

    def make(self, now: float) -> None:
        """Insert the slots that fell since the last insert (at the first, the
        catch-up's), then poll the workers that got ticks."""
        if self.due is None or now < self.due:
            return
        try:
            made: _Made = self.outbox.transaction("making ticks", self._insert)
        except Deferred:
            self.due = self.outbox.blocked_until
            return
        for periodic, slots, left_out in made.slots:
            if periodic.made_up_to is None and left_out:
                log.warning(
                    "periodic worker %s: catch_up='all' made the %d latest missed slots "
                    "and left out %d older one(s)",
                    periodic.name,
                    len(slots),
                    left_out,
                    extra={"worker": periodic.name},
                )
            periodic.made_up_to = made.now
            if slots:
                periodic.state.poll_now(now)
        self.due = min(self._monotonic(p.schedule.next_after(made.now)) for p in self.periodic)

    def _insert(self, conn: Connection) -> _Made:
        # One transaction for every periodic worker: the clock is read once, and
        # nothing counts as made unless all of it commits.
        seconds = float(conn.execute(select(self.dialect.now())).scalar_one())
        self.offset = seconds - time.time()
        now = dt.datetime.fromtimestamp(seconds, UTC)
        made = []
        for periodic in self.periodic:
            left_out = 0
            if periodic.made_up_to is None:
                slots, left_out = periodic.schedule.missed(self._latest(conn, periodic), now)
            else:
                slots = periodic.schedule.slots(periodic.made_up_to, now)
            self.dialect.insert_ticks(
                conn, TICKS, periodic.name, [to_microseconds(s) for s in slots]
            )
            made.append((periodic, slots, left_out))
        return _Made(now, made)

    def _latest(self, conn: Connection, periodic: Periodic) -> dt.datetime | None:
        """The latest slot any coordinator made of ``periodic``'s worker (an index
        lookup: the unique index leads with the worker)."""
        slot = conn.execute(
            select(func.max(Tick.slot)).where(Tick.worker == periodic.name)
        ).scalar()
        return None if slot is None else from_microseconds(int(slot))

    def _monotonic(self, moment: dt.datetime) -> float:
        """``moment`` on the database's clock as a ``time.monotonic()`` deadline."""
        return time.monotonic() + moment.timestamp() - (time.time() + self.offset)
