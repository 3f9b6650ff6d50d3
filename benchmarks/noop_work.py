"""The work the throughput benchmarks measure: a row holding nothing but its key, and a
handler that does nothing with it. Module-level, so handler processes import it."""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy import Integer
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, Finished

#: The worker ``benchmarks.throughput`` measures.
THROUGHPUT_WORKER = "bench_throughput"


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


def throughput_coordinator(
    session_factory: sessionmaker[Session],
    url: str,
    concurrency: int = 2,
    poll_seconds: float | None = None,
    executor: str = "pool",
) -> Coordinator:
    """The coordinator both sides of ``benchmarks.throughput`` build: the worker service
    starts it; the inserting side only registers, so that its session factory's commits
    wake the service (``notifications``, on by default), as an application's do."""
    if poll_seconds is None:
        coordinator = Coordinator(session_factory, database_url=url)
    else:
        coordinator = Coordinator(
            session_factory,
            database_url=url,
            poll_seconds=poll_seconds,
            max_poll_seconds=poll_seconds,
        )
    coordinator.transactional_worker(
        name=THROUGHPUT_WORKER, source=NoopItem, concurrency=concurrency, executor=executor
    )(noop)
    return coordinator


def insert_items_through(session_factory: sessionmaker[Session], first: int, count: int) -> None:
    """``insert_items`` through an application's session factory (one transaction)."""
    with session_factory.begin() as session:
        session.execute(sa.insert(NoopItem), [{"id": i} for i in range(first, first + count)])
