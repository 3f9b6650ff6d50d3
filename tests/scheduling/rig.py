"""A scheduler of one worker over a real database, with an executor the test provides
(for tests that drive the scheduler's passes themselves)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, sessionmaker

from dbworker import Coordinator
from dbworker.core.timing import PollBackoff
from dbworker.dialects import Owner
from dbworker.engines import coordination_engine
from dbworker.scheduling.loop import Scheduler
from dbworker.scheduling.state import WorkerState


def not_run(source: Any, session: Any) -> Any:
    raise AssertionError("not run here")


@contextlib.contextmanager
def scheduler_of(
    database_url: str,
    base: type[DeclarativeBase],
    source: type[Any],
    worker: str,
    executor: Any,
    backoff: PollBackoff,
) -> Iterator[tuple[Scheduler, WorkerState, sa.Engine]]:
    """The scheduler of ``worker`` (rows of ``source``, a model of ``base``) and its
    state, with ``executor``, and the application's engine; its tables dropped after."""
    app = sa.create_engine(database_url)
    base.metadata.create_all(app)
    coordinator = Coordinator(sessionmaker(app), database_url=database_url)
    coordinator.transactional_worker(name=worker, source=source)(not_run)
    coordinator.create_worker_tables()
    dialect = coordinator._dialect
    engine = coordination_engine(coordinator._url, dialect, coordinator.engine_options)
    state = WorkerState(coordinator._registration(worker), executor, backoff)
    scheduler = Scheduler(engine, dialect, [state], coordinator._timings, Owner.current())
    try:
        yield scheduler, state, app
    finally:
        scheduler.outbox.close()
        engine.dispose()
        base.metadata.drop_all(app)
        app.dispose()
