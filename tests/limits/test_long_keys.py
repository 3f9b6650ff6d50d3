"""Keys longer than the 255 characters ``held_key`` and the rate slots hold (issue 26):
any key works. A database that enforces VARCHAR lengths stores a long key as a digest
of its text (``Claiming.stored_key``), so two long keys that share their first 255
characters stay different keys, and equal long keys stay equal."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, Finished
from dbworker.core.limits import HELD_KEY_LENGTH
from dbworker.dialects import Owner, WorkerTable, for_url
from dbworker.limit_options import check_limits

LONG = "k" * 300
#: Differs from LONG only after the first 255 characters.
LONG_TOO = "k" * 299 + "x"


class _Base(DeclarativeBase):
    pass


class LongKeyJob(_Base):
    __tablename__ = "long_key_jobs"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    key: Mapped[str] = mapped_column(sa.String(1000))


def _handle(job: LongKeyJob, session: Session) -> Finished:
    return Finished()


def _worker(coordinator: Coordinator, name: str, **limits: Any) -> WorkerTable:
    source = LongKeyJob.__table__
    assert isinstance(source, sa.Table)
    table = coordinator.workers[name].execution_table
    return WorkerTable(
        name, table, source.c.id, monotonic_keys=True, limits=check_limits(source, **limits)
    )


def _claim(url: str, worker: WorkerTable) -> list[Any]:
    dialect = for_url(url)
    # Configured as the coordinator's engine is (READ COMMITTED on MySQL).
    engine = sa.create_engine(url, **dialect.coordinator_engine_options())
    dialect.configure_engine(engine)
    with engine.begin() as conn:
        dialect.discover(conn, worker)
        eligible = sa.select(LongKeyJob).order_by(LongKeyJob.id)
        claims = dialect.claim(conn, worker, eligible, 10, 30.0, Owner.current())
    engine.dispose()
    return sorted(c.source_id for c in claims)


def test_long_keys_are_exclusive_and_rate_limited_by_their_whole_text(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    _Base.metadata.create_all(engine)
    coordinator = Coordinator(sessionmaker(engine), database_url=database_url)
    coordinator.transactional_worker("long_exclusive", LongKeyJob, exclusive_by=LongKeyJob.key)(
        _handle
    )
    coordinator.transactional_worker(
        "long_rated", LongKeyJob, rate_limit="1/h", rate_limit_by=LongKeyJob.key
    )(_handle)
    coordinator.create_worker_tables()
    with engine.begin() as conn:
        conn.execute(
            sa.insert(LongKeyJob),
            [
                {"id": 1, "key": LONG},
                {"id": 2, "key": LONG},
                {"id": 3, "key": LONG_TOO},
                {"id": 4, "key": "short"},
            ],
        )
    try:
        exclusive = _worker(coordinator, "long_exclusive", exclusive_by=LongKeyJob.key)
        assert _claim(database_url, exclusive) == [1, 3, 4], "one item per key, long keys distinct"
        with engine.connect() as conn:
            held = dict(
                conn.execute(
                    sa.select(exclusive.table.c.source_id, exclusive.table.c.held_key)
                ).all()
            )
        assert held[1] != held[3]
        if engine.dialect.name != "sqlite":  # SQLite enforces no VARCHAR length: kept whole
            assert all(len(k) <= HELD_KEY_LENGTH for k in held.values() if k is not None)
        assert _claim(database_url, exclusive) == [], "item 2's key is held by item 1"

        rated = _worker(coordinator, "long_rated", rate_limit="1/h", rate_limit_by=LongKeyJob.key)
        assert _claim(database_url, rated) == [1, 3, 4], "one claim per key and hour"
        assert _claim(database_url, rated) == [], "item 2's key used its hour's claim"
    finally:
        engine.dispose()
