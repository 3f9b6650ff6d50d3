"""``Operations``: what an operator needs to watch and steer a coordinator's workers.

The CLI, the dashboard and the metrics are built on it alone. Everything but
``live()`` reads the database through the application's session factory, so it
answers whether or not this coordinator runs, from any host that reaches the
database; nothing it does creates a table or an empty SQLite file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from ..core.errors import ConfigurationError
from ..dialects import Dialect
from ..registry import Timing, has_table, list_coordinators
from ..tables import WorkerTables
from ..worker import RegisteredWorkers, Registration, Worker
from .figures import backlog_of, read_backlog
from .item import read_item
from .limits import read_limits
from .live import running_and_held
from .results import (
    Backlog,
    FailedRecord,
    ItemRecord,
    LimitFigures,
    LiveGauges,
    RegisteredCoordinator,
    ServedWorker,
    WorkerLoad,
)
from .schedules import ScheduleState, read_schedules

if TYPE_CHECKING:
    from ..registry import Heartbeat
    from ..scheduling import Scheduler


class Operations:
    """What an operator needs to watch and steer workers: ``coordinator.operations``.

    The coordinator builds it; the callables read what changes while it runs.
    """

    def __init__(
        self,
        *,
        session_factory: Callable[[], Session],
        dialect: Dialect,
        workers: RegisteredWorkers,
        tables: WorkerTables,
        registry_timing: Callable[[], Timing],
        scheduler: Callable[[], Scheduler | None],
        heartbeat: Callable[[], Heartbeat | None],
        cancel: Callable[[Session, str, Any], bool],
    ) -> None:
        self._session_factory = session_factory
        self._dialect = dialect
        self._workers = workers
        self._tables = tables
        self._registry_timing = registry_timing
        self._scheduler = scheduler
        self._heartbeat = heartbeat
        self._cancel = cancel

    # -- what runs where -------------------------------------------------------------

    def coordinators(self) -> list[RegisteredCoordinator]:
        """The coordinators registered in the database, oldest first, live or stale.

        Raises ConfigurationError if the registry table does not exist (created by
        ``create_worker_tables()``, ``dbworker create-tables`` or your migrations).
        """
        table = self._tables.registry()
        with self._reading() as conn:
            if not has_table(conn, table):
                raise ConfigurationError(
                    f"the table {table.name} does not exist yet: run `dbworker create-tables` "
                    "(or your migrations) first"
                )
            rows = list_coordinators(conn, self._dialect, table, self._registry_timing())
        return [
            RegisteredCoordinator(
                id=row["id"],
                host=row["host"],
                pid=row["pid"],
                version=row["version"],
                workers=tuple(
                    ServedWorker(w["name"], w["concurrency"], w["executor"]) for w in row["workers"]
                ),
                database=row["database"],
                started_at=row["started_at"],
                heartbeat_at=row["heartbeat_at"],
                heartbeat_age=row["heartbeat_age"],
                uptime=row["uptime"],
                alive=not row["stale"],
            )
            for row in rows
        ]

    def live(self) -> LiveGauges:
        """This coordinator's gauges, without a query: handlers running and claims held
        per worker (zero unless started), and the latest cached backlog its heartbeat
        read or counted. Cheap enough for every metrics scrape."""
        counts = running_and_held(self._scheduler())
        workers = {
            name: WorkerLoad(worker.concurrency, *counts.get(name, (0, 0)))
            for name, worker in self._workers.items()
        }
        heartbeat = self._heartbeat()
        latest = None if heartbeat is None else heartbeat.latest
        if latest is None:
            return LiveGauges(workers, {}, None)
        stats, measured = latest
        age = max(0.0, time.monotonic() - measured)
        backlog = {
            name: backlog_of(name, figures, age, cached=True) for name, figures in stats.items()
        }
        return LiveGauges(workers, backlog, age)

    def schedules(self) -> list[ScheduleState]:
        """Each periodic worker's schedule, last slot made (and its tick's status) and
        next slot, in registration order; empty, without a query, when there are none."""
        periodic = [w for w in self._chosen(None) if w.schedule is not None]
        if not periodic:
            return []
        self._tables.require(periodic)
        [ticks] = self._tables.ticks()  # one shared table, there with any periodic worker
        with self._reading() as conn:
            return read_schedules(conn, self._dialect, ticks, periodic)

    # -- the work --------------------------------------------------------------------

    def check_tables(self, workers: str | Iterable[str] | None = None) -> list[Worker]:
        """The named workers (default: all), once their execution tables are known to
        exist: an unknown name raises UnknownWorkerError, a missing table DBWorkerError
        naming the command that creates it."""
        chosen = self._chosen(workers)
        self._tables.require(chosen)
        return [self._workers[worker.name] for worker in chosen]

    def backlog(
        self, workers: str | Iterable[str] | None = None, *, live: bool = False
    ) -> dict[str, Backlog]:
        """Each named worker's (default: all) records per status and the work waiting:
        a running coordinator's recent count (``Backlog.age`` says how old), or
        counted now when none has one from the last 10 minutes or with ``live``."""
        chosen = self._chosen(workers)
        registry = None if live else self._tables.registry()
        with self._reading() as conn:
            return read_backlog(conn, self._dialect, chosen, registry, self._registry_timing())

    def limits(self, workers: str | Iterable[str] | None = None) -> dict[str, LimitFigures]:
        """The limits of each named worker (default: all) that has ``exclusive_by`` or
        ``rate_limit``, with the items they hold back, counted now (one query per
        figure; none at all when no worker is limited)."""
        chosen = [w for w in self._chosen(workers) if w.table.limits is not None]
        if not chosen:
            return {}
        self._tables.require(chosen)
        with self._reading() as conn:
            return read_limits(conn, self._dialect, chosen)

    def failed_items(
        self, worker: str, limit: int | None = None, *, tracebacks: bool = False
    ) -> list[FailedRecord]:
        """``worker``'s FAILED records in key order, at most ``limit``; with their
        tracebacks if asked (long texts: for a page of them)."""
        registration = self._workers.registration(worker)
        with self._reading() as conn:
            items = self._dialect.failed(conn, registration.table, limit, tracebacks=tracebacks)
            return [FailedRecord(**item) for item in items]

    def record(self, worker: str, source_id: Any) -> ItemRecord | None:
        """The execution record of ``source_id`` in full, pending or not; None if
        ``worker`` has none."""
        registration = self._workers.registration(worker)
        with self._reading() as conn:
            return read_item(conn, registration, source_id)

    def source_id(self, worker: str, text: str) -> Any:
        """A source id typed by a person (a command line, an address) in the type of
        ``worker``'s key column; ConfigurationError if it is not one."""
        return self._workers.registration(worker).source_id_from_text(text)

    # -- steering --------------------------------------------------------------------

    def retry(self, worker: str, source_id: Any) -> bool:
        """Reset a failed item (``Worker.reset_failed``) so it runs again when eligible;
        False (nothing changed) if it was not failed."""
        return bool(self.retry_failed(worker, [source_id]))

    def retry_failed(self, worker: str, source_ids: Iterable[Any] | None = None) -> list[Any]:
        """Reset the failed items among ``source_ids`` (default: every failed item of
        ``worker``) in one transaction; the ids reset, in order."""
        registration = self._workers.registration(worker)
        self._tables.check_database_exists()
        with self._session_factory() as session:
            if source_ids is None:
                source_ids = [item["source_id"] for item in registration.failed(session)]
            reset = [key for key in source_ids if registration.reset_failed(session, key)]
            session.commit()
        return reset

    def cancel(self, worker: str, source_id: Any) -> bool:
        """Cancel an open item (``Coordinator.cancel``) in a transaction of its own;
        False (nothing changed) if it was finished or failed already."""
        self._workers.registration(worker)
        self._tables.check_database_exists()
        with self._session_factory() as session:
            cancelled = self._cancel(session, worker, source_id)
            session.commit()
        return cancelled

    # -- helpers ---------------------------------------------------------------------

    def _chosen(self, workers: str | Iterable[str] | None) -> list[Registration]:
        if workers is None:
            workers = list(self._workers)
        elif isinstance(workers, str):
            workers = [workers]
        return [self._workers.registration(name) for name in workers]

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        """A connection of the session factory's, its transaction rolled back after."""
        self._tables.check_database_exists()
        with self._session_factory() as session:
            yield session.connection()
            session.rollback()
