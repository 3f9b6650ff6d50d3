"""Periodic workers with limits (issue 26), for the limits suite's services: ``beat``
(exclusive: its ticks take longer than its period, so without exclusivity they would
overlap) and ``rated`` (ticks made faster than its rate lets them run).

At module scope: pool children import the handlers by reference.
"""

from __future__ import annotations

import datetime as dt
import os
import time

from sqlalchemy import Double, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Coordinator, Finished, Tick

EXCLUSIVE = "limits_beat"
RATED = "limits_rated_beat"
#: The exclusive worker's period, and how long each of its ticks runs (longer).
EVERY = dt.timedelta(seconds=0.5)
RUN_SECONDS = 0.8
#: The rated worker makes 10 ticks a second and may claim 2 a second.
RATED_EVERY = dt.timedelta(seconds=0.1)
RATE = 2


class PeriodicBase(DeclarativeBase):
    pass


class TickRunRecord(PeriodicBase):
    """One committed run of a tick: when it started and ended (this host's clock: the
    services run here), and which process ran it."""

    __tablename__ = "limits_tick_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    worker: Mapped[str] = mapped_column(String(32))
    tick_id: Mapped[int] = mapped_column(Integer)
    started: Mapped[float] = mapped_column(Double)
    ended: Mapped[float] = mapped_column(Double)
    pid: Mapped[int] = mapped_column(Integer)


def _record(tick: Tick, session: Session, seconds: float) -> Finished:
    started = time.time()
    time.sleep(seconds)
    session.add(
        TickRunRecord(
            worker=tick.worker, tick_id=tick.id, started=started, ended=time.time(), pid=os.getpid()
        )
    )
    return Finished()


def beat(tick: Tick, session: Session) -> Finished:
    return _record(tick, session, RUN_SECONDS)


def rated_beat(tick: Tick, session: Session) -> Finished:
    return _record(tick, session, 0.0)


def register(coordinator: Coordinator, concurrency: int) -> None:
    coordinator.periodic_worker(
        EXCLUSIVE, every=EVERY, concurrency=concurrency, catch_up="all", exclusive=True
    )(beat)
    coordinator.periodic_worker(
        RATED,
        every=RATED_EVERY,
        concurrency=concurrency,
        catch_up="all",
        rate_limit=f"{RATE}/s",
    )(rated_beat)
