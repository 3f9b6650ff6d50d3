"""The periodic worker of the periodic suite: each tick's run commits one row."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, Integer
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Coordinator, Finished, Tick

NAME = "beat"
EVERY = dt.timedelta(seconds=1)


class Base(DeclarativeBase):
    pass


class TickRun(Base):
    """One committed run of a tick (its handler's write, committed with FINISHED)."""

    __tablename__ = "periodic_tick_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tick_id: Mapped[int] = mapped_column(Integer)
    slot: Mapped[int] = mapped_column(BigInteger)


def beat(tick: Tick, session: Session) -> Finished:
    assert tick.worker == NAME and tick.scheduled_at.tzinfo is not None
    session.add(TickRun(tick_id=tick.id, slot=tick.slot))
    return Finished()


def register(coordinator: Coordinator, catch_up: str = "latest") -> None:
    coordinator.periodic_worker(NAME, every=EVERY, catch_up=catch_up)(beat)
