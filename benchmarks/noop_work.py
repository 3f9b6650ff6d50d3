"""The work the throughput benchmarks measure: a row holding nothing but its key, and a
handler that does nothing with it. Module-level, so handler processes import it."""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy import Integer
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Finished


class Base(DeclarativeBase):
    pass


class NoopItem(Base):
    __tablename__ = "bench_noop_items"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)


ITEMS_TABLE = Base.metadata.tables[NoopItem.__tablename__]


def noop(source: NoopItem, session: Session) -> Finished:
    return Finished()


def insert_items(engine: sa.Engine, first: int, count: int) -> float:
    """Insert ids first..first+count-1 in one transaction; return the epoch time before."""
    started = time.time()
    with engine.begin() as conn:
        conn.execute(sa.insert(NoopItem), [{"id": i} for i in range(first, first + count)])
    return started
