"""Helpers of the operations tests: waiting, the application's data, health and log checks.

Nothing here asserts on time: ``wait_until`` polls for a condition with a deadline
generous enough for a loaded CI machine, and only bounds how long a failing test
takes to say so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, func, select, update
from sqlalchemy.orm import Session, sessionmaker

import waiting
from dbworker import Coordinator
from dbworker.dialects import for_url
from execution_reads import ExecutionReads
from runfiles import write_atomically

from . import app

T = TypeVar("T")

DEADLINE = 90.0

#: Quick polling keeps the tests short; it does not change what is tested.
FAST: dict[str, Any] = {"poll_seconds": 0.05, "max_poll_seconds": 0.5, "lease_seconds": 10}


def wait_until(
    predicate: Callable[[], T],
    what: str,
    timeout: float = DEADLINE,
    diagnose: Callable[[], object] | None = None,
) -> T:
    # Longer than elsewhere by default: these tests wait out database restarts.
    return waiting.wait_until(predicate, what, timeout=timeout, diagnose=diagnose)


def open_engine(url: str, **options: Any) -> Engine:
    """An engine set up like dbworker's own: on SQLite the test's reads wait for a
    writer (busy timeout) instead of failing; on MySQL they read committed rows."""
    dialect = for_url(url)
    engine = create_engine(url, **{**dialect.coordinator_engine_options(), **options})
    dialect.configure_engine(engine)
    return engine


@dataclass
class Site(ExecutionReads):
    """One test's database, engine, work directory and coordinators."""

    url: str
    engine: Engine
    workdir: Path
    coordinators: list[Coordinator] = field(default_factory=list)
    session_factory: sessionmaker[Session] = field(init=False)

    def __post_init__(self) -> None:
        self.session_factory = sessionmaker(self.engine, expire_on_commit=False)

    def coordinator(self, **options: Any) -> Coordinator:
        coordinator = Coordinator(
            self.session_factory, database_url=self.url, **{**FAST, **options}
        )
        self.coordinators.append(coordinator)
        return coordinator

    def add_jobs(self, ids: Iterable[int], mode: str, **values: Any) -> list[int]:
        ids = list(ids)
        with self.session_factory.begin() as session:
            session.add_all(
                app.Job(id=i, mode=mode, workdir=str(self.workdir), **values) for i in ids
            )
        return ids

    def set_job(self, job_id: int, **values: Any) -> None:
        with self.session_factory.begin() as session:
            session.execute(update(app.Job).where(app.Job.id == job_id).values(**values))

    def open_gate(self, job_id: int) -> None:
        write_atomically(app.gate_path(self.workdir, job_id), "go")

    def runs(self, job_id: int) -> list[tuple[float, int]]:
        """(database time, pid) of each run of ``job_id`` that began, in run order."""
        found = []
        number = 1
        while (path := app.run_path(self.workdir, job_id, number)).exists():
            db_time, pid = path.read_text().split()
            found.append((float(db_time), int(pid)))
            number += 1
        return found

    def effects(self) -> dict[int, int]:
        """Committed effects per job id."""
        with self.session_factory() as session:
            rows = session.execute(
                select(app.Effect.job_id, func.count()).group_by(app.Effect.job_id)
            ).all()
        return {int(job_id): int(n) for job_id, n in rows}

    def wait_for_runs(self, job_id: int, count: int = 1) -> None:
        wait_until(lambda: len(self.runs(job_id)) >= count, f"run {count} of job {job_id}")

    def close(self) -> None:
        for coordinator in self.coordinators:
            # Bounded: a failed test must not hang its teardown on a gated handler.
            coordinator.stop(timeout=0)
        self.engine.dispose()


@contextmanager
def site(url: str, workdir: Path, **engine_options: Any) -> Iterator[Site]:
    engine = open_engine(url, **engine_options)
    app.Base.metadata.create_all(engine, tables=app.APP_TABLES)
    workdir.mkdir(parents=True, exist_ok=True)
    value = Site(url, engine, workdir)
    try:
        yield value
    finally:
        value.close()


# -- health, watched from a thread -------------------------------------------------------


@dataclass
class HealthLog:
    """What a polling thread saw of ``coordinator.health()``."""

    saw_outage: bool = False
    errors: list[str] = field(default_factory=list)
    error_times: list[float] = field(default_factory=list)
    samples: int = 0


@contextmanager
def watch_health(coordinator: Coordinator, interval: float = 0.02) -> Iterator[HealthLog]:
    seen = HealthLog()
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            health = coordinator.health()
            seen.samples += 1
            if not health.database_ok:
                seen.saw_outage = True
            if health.last_error is not None and health.last_error not in seen.errors:
                seen.errors.append(health.last_error)
            if health.last_error_at is not None and health.last_error_at not in seen.error_times:
                seen.error_times.append(health.last_error_at)
            stop.wait(interval)

    thread = threading.Thread(target=poll, name="health-watch", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


# -- log records -------------------------------------------------------------------------


class Records(logging.Handler):
    """Keeps every record of the ``dbworker`` logger, from any thread."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._records_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._records_lock:
            self.records.append(record)

    def snapshot(self) -> list[logging.LogRecord]:
        with self._records_lock:
            return list(self.records)


@contextmanager
def capture_dbworker_logs(level: int = logging.INFO) -> Iterator[Records]:
    logger = logging.getLogger("dbworker")
    handler = Records()
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


ITEM_CONTEXT = ("worker", "source_id", "attempt")


def about_an_item(record: logging.LogRecord) -> bool:
    """A record is about an item when it says so ("item ..." in the message, as every
    such message of dbworker's does), or names a worker or source_id."""
    return (
        record.getMessage().startswith("item")
        or record.__dict__.get("worker") is not None
        or record.__dict__.get("source_id") is not None
    )


def missing_item_context(record: logging.LogRecord) -> list[str]:
    """What an item record lacks (an attribute) or repeats (``name=`` in the message)."""
    message = record.getMessage()
    missing = [f"attribute {name}" for name in ITEM_CONTEXT if record.__dict__.get(name) is None]
    missing += [f"no {name}= in the message" for name in ITEM_CONTEXT if f"{name}=" in message]
    return missing


def check_item_records(records: Sequence[logging.LogRecord]) -> list[logging.LogRecord]:
    """Assert every record carries the worker, source_id and attempt attributes, and
    that those about an item set them and do not repeat them in the message; return
    the item records."""
    bare = [r.getMessage()[:300] for r in records if not all(hasattr(r, n) for n in ITEM_CONTEXT)]
    assert not bare, f"dbworker records without the item attributes: {bare}"
    items = [record for record in records if about_an_item(record)]
    problems = [
        f"{record.levelname} {record.getMessage()[:300]!r}: lacks {', '.join(missing)}"
        for record in items
        if (missing := missing_item_context(record))
    ]
    assert not problems, "log records about items without their context:\n" + "\n".join(problems)
    return items
