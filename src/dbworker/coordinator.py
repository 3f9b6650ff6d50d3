"""The Coordinator: registers workers, owns their tables, runs the scheduler."""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from sqlalchemy import Engine, Table
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from .cancellation import Cancellation
from .core.errors import ConfigurationError, DBWorkerError
from .core.schedules import Schedule
from .core.status import ExecutionStatus
from .core.timing import PollBackoff, RetryPolicy, Timings
from .dialects import Dialect, Owner, for_url
from .drain import DEFAULT_MAX_INVOCATIONS, DrainReport, drain
from .engines import coordination_engine
from .events import Events
from .executors import ExecutorChoice, chooser
from .executors import resolve as resolve_executor
from .exit_hook import forget, stop_at_exit
from .forkserver import preload_forkserver
from .health import Health
from .invocation import ChildConfig, ProcessRunner
from .limit_options import check_limits
from .logs import logger
from .operations import Operations
from .periodic import Tick, periodic_limits, periodic_registration
from .preflight import (
    check_async_driver,
    check_coordinator_arguments,
    check_driver,
    check_main_guard,
    check_stop_timeout,
    resolve_sqlite_path,
)
from .registry import Heartbeat, Timing, log_started, start_heartbeat
from .scheduling import Scheduler, WorkerState
from .schema import coordinators_table
from .tables import WorkerTables
from .wake_wiring import WakeWiring
from .wakeups import Watched
from .worker import (
    DEFAULT_MAX_CRASHES,
    Eligible,
    HandlerDecorator,
    RegisteredWorkers,
    Registration,
    SourceModel,
    Worker,
    check_importable,
    check_options,
    check_picklable,
    source_mapper,
)

#: The decorated function, returned as it came (``HandlerDecorator`` types it).
AnyHandler = TypeVar("AnyHandler", bound=Callable[..., Any])

log = logger()


class Coordinator:
    """Coordinates workers through the application's database.

    ``session_factory`` is the application's; dbworker creates its tables through
    it and checks it points at ``database_url``. Scheduling runs on a dedicated
    engine built from ``database_url`` and ``engine_options`` (as child processes
    do), so a busy application pool can never starve lease renewals. ``listen_url``:
    where the listener connects instead (the server itself, past a pooler).
    """

    def __init__(
        self,
        session_factory: sessionmaker[Any] | Callable[[], Session],
        *,
        database_url: str | URL,
        engine_options: Mapping[str, Any] | None = None,
        lease_seconds: float = 30,
        poll_seconds: float = 0.25,
        max_poll_seconds: float = 10,
        executor: ExecutorChoice | str = "pool",
        notifications: bool = True,
        listen_url: str | URL | None = None,
    ) -> None:
        given = check_coordinator_arguments(session_factory, database_url, engine_options)
        self.session_factory = session_factory
        self.engine_options: dict[str, Any] = dict(engine_options or {})
        self._timings = Timings(lease_seconds, poll_seconds, max_poll_seconds)
        self._executor_choice = resolve_executor(executor)
        self._dialect: Dialect = for_url(given)
        self._dialect.validate_url(given)
        check_driver(given)
        #: As given, for messages; ``_url`` is what every engine connects to.
        self._given_url = given
        self._url = resolve_sqlite_path(given)
        self._workers: dict[str, Registration] = {}
        self._tables = WorkerTables(session_factory, self._dialect, self._url, given, self._workers)
        self._tables.check_same_database()
        self._lock = threading.Lock()
        self._scheduler: Scheduler | None = None
        self._stopped = False
        self._engine: Engine | None = None
        self._events = Events()
        #: The registry's periods (``dbworker.registry``); tests shorten them.
        self._registry_timing = Timing()
        self._heartbeat: Heartbeat | None = None
        if not isinstance(notifications, bool):
            raise ConfigurationError(f"notifications must be True or False, got {notifications!r}")
        #: Whether commits wake coordinators (NOTIFY, the local channel); polling
        #: alone finds the work when False.
        self.notifications = notifications
        self._wake_wiring = WakeWiring(
            session_factory, self._dialect, self._url, self._workers, notifications, listen_url
        )
        sender = self._wake_wiring.sender
        self._cancellation = Cancellation(self._dialect, self._workers, sender, self._events)
        self._operations = Operations(
            session_factory=session_factory,
            dialect=self._dialect,
            workers=RegisteredWorkers(self._workers),
            tables=self._tables,
            registry_timing=lambda: self._registry_timing,
            scheduler=lambda: self._scheduler,
            heartbeat=lambda: self._heartbeat,
            cancel=self._cancellation.cancel,
        )

    @property
    def database_url(self) -> str:
        return self._url.render_as_string(hide_password=False)

    @property
    def workers(self) -> Mapping[str, Worker]:
        """Registered workers by name (read-only); an unknown name raises
        UnknownWorkerError (a KeyError) naming the registered ones."""
        return RegisteredWorkers(self._workers)

    @property
    def operations(self) -> Operations:
        """What an operator needs to watch and steer the workers: the coordinators
        registered in the database, backlogs, failed items and their retry, and this
        coordinator's live gauges (``dbworker.Operations``)."""
        return self._operations

    @property
    def events(self) -> Events:
        """The scheduler's events: ``coordinator.events.subscribe(listener)``."""
        return self._events

    @property
    def lease_seconds(self) -> float:
        return self._timings.lease_seconds

    @property
    def poll_seconds(self) -> float:
        return self._timings.poll_seconds

    @property
    def max_poll_seconds(self) -> float:
        return self._timings.max_poll_seconds

    # -- registration ------------------------------------------------------------------

    def transactional_worker(
        self,
        name: str,
        source: type[SourceModel],
        eligible: Eligible | None = None,
        concurrency: int = 1,
        *,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        max_crashes: int = DEFAULT_MAX_CRASHES,
        executor: ExecutorChoice | str | None = None,
        exclusive_by: Any = None,
        rate_limit: str | None = None,
        rate_limit_by: Any = None,
    ) -> HandlerDecorator[SourceModel]:
        """Register the decorated function (``def`` taking a Session, or ``async def``
        taking an AsyncSession) as the handler of worker ``name``. The function is
        returned unchanged, so it stays callable in unit tests (limits: api.md)."""
        check_options(self._url, name, eligible, concurrency, timeout, retry, max_crashes)
        pick = chooser(self._executor_choice, executor)
        self._check_name_free(name)
        limits = (exclusive_by, rate_limit, rate_limit_by)  # checked before the decorator runs
        check_limits(source_mapper(source).primary_key[0].table, *limits)

        def register(handler: AnyHandler) -> AnyHandler:
            self._add(
                pick(handler),
                handler,
                lambda: Registration(
                    name, handler, source, eligible, concurrency, self._dialect,
                    timeout, retry, max_crashes, pick(handler), None, None, *limits,
                ),
            )  # fmt: skip
            return handler

        return register

    def periodic_worker(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: dt.timedelta | None = None,
        timezone: str = "UTC",
        catch_up: str = "latest",
        concurrency: int = 1,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        max_crashes: int = DEFAULT_MAX_CRASHES,
        executor: ExecutorChoice | str | None = None,
        exclusive: bool = False,
        rate_limit: str | None = None,
    ) -> HandlerDecorator[Tick]:
        """Register the decorated function as periodic worker ``name``, called with a
        ``Tick`` for each slot of ``cron`` (five fields, in ``timezone``) or ``every``
        (a timedelta), made once however many coordinators run. ``catch_up`` ("latest",
        "all", "none"): what a start after every coordinator was down makes of the
        slots missed meanwhile. ``exclusive``: no two ticks run at once (``rate_limit``)."""
        schedule = Schedule.of(cron=cron, every=every, timezone=timezone, catch_up=catch_up)
        limits = periodic_limits(exclusive, rate_limit)
        check_options(self._url, name, None, concurrency, timeout, retry, max_crashes)
        pick = chooser(self._executor_choice, executor)
        self._check_name_free(name)

        def register(handler: AnyHandler) -> AnyHandler:
            self._add(
                pick(handler),
                handler,
                lambda: periodic_registration(
                    name, handler, schedule, concurrency=concurrency, dialect=self._dialect,
                    timeout=timeout, retry=retry, max_crashes=max_crashes, executor=pick(handler),
                    limits=limits,
                ),
            )  # fmt: skip
            return handler

        return register

    def _check_name_free(self, name: str, made: Registration | None = None) -> None:
        """Refuse a name already taken, or any after start(); add ``made`` if given,
        under the same lock."""
        with self._lock:
            self._check_not_started("register a worker")
            if name in self._workers:
                raise ConfigurationError(f"a worker named {name!r} is already registered")
            if made is not None:
                self._workers[name] = made
                # Beside the execution table, so create_all and Alembic see it too.
                coordinators_table(made.table.table.metadata)

    def _add(
        self, chosen: ExecutorChoice, handler: Any, registration: Callable[[], Registration]
    ) -> None:
        check_async_driver(chosen, self._url)
        check_importable(handler)
        made = registration()
        chosen.check_handler(made.name, handler, made.source)
        self._check_name_free(made.name, made)

    def _registration(self, name: str) -> Registration:
        return RegisteredWorkers(self._workers).registration(name)

    def _check_not_started(self, action: str) -> None:
        if self._stopped:
            raise ConfigurationError(
                f"cannot {action} after stop(): a Coordinator runs once; build a new one"
            )
        if self._scheduler is not None:
            raise ConfigurationError(f"cannot {action} after start()")

    # -- tables ------------------------------------------------------------------------

    def create_worker_tables(self) -> None:
        """Create the execution tables of all registered workers (idempotent), and
        check that tables which already exist have the shape this version expects."""
        self._tables.create()

    def _registry_table(self) -> Table:
        """The coordinator registry, in the first worker's source MetaData."""
        return self._tables.registry()

    # -- running -------------------------------------------------------------------------

    def start(self) -> None:
        """Start claiming and running work in the background; returns at once."""
        with self._lock:
            self._check_not_started("start")
            if not self._workers:
                raise ConfigurationError("register at least one worker before start()")
            if any(worker.executor.reruns_main for worker in self._workers.values()):
                check_main_guard()
            for worker in self._workers.values():
                check_picklable(worker.name, worker.handler)
                worker.eligible_query()
            self._tables.check_database_exists()
            engine = coordination_engine(self._url, self._dialect, self.engine_options)
            states: list[WorkerState] = []
            try:
                with self.session_factory() as session:
                    self._tables.check(session, engine)
                with engine.connect() as conn:
                    self._dialect.learn_server(conn)
                preload_forkserver(self._url, self._workers.values())
                runner = self._runner()
                timings = self._timings
                for worker in self._workers.values():
                    backoff = PollBackoff(timings.poll_seconds, timings.max_poll_seconds)
                    executor = worker.executor.build(worker.concurrency, runner, os.getpid())
                    states.append(WorkerState(worker, executor, backoff))
                scheduler = Scheduler(
                    engine,
                    self._dialect,
                    states,
                    timings,
                    Owner.current(),
                    events=self._events,
                    wakeups=self._wake_wiring.listener(engine, self._timings),
                )
                scheduler.start()
            except BaseException:
                # A failed start leaves nothing running, so start() can be called again
                # once the cause is fixed (and stop() has nothing to join).
                for state in states:
                    state.executor.shutdown()
                engine.dispose()
                raise
            self._engine = engine
            self._scheduler = scheduler
            stop_at_exit(self)
            self._heartbeat = start_heartbeat(
                engine,
                self._dialect,
                self._registry_table(),
                list(self._workers.values()),
                self._url.render_as_string(hide_password=True),
                self._registry_timing,
                activity=lambda: scheduler.health.claimed + scheduler.health.completed,
            )
        log_started(self._workers.values(), self._url.render_as_string(hide_password=True))

    # -- wake-ups ------------------------------------------------------------------------

    def _watched(self) -> list[Watched]:
        return self._wake_wiring.watched()

    def notify_trigger_sql(self, worker: str) -> list[str]:
        """PostgreSQL DDL for an opt-in trigger that wakes ``worker`` on any write to the
        tables its ``eligible`` reads (its source included), by whomever: raw SQL,
        another service, a bulk load. Run it in a migration (``op.execute``) or with
        ``create_notify_triggers()``. See docs/databases.md for what NOTIFY costs."""
        return self._wake_wiring.trigger_sql(self._registration(worker))

    def create_notify_triggers(self, workers: Iterable[str] | None = None) -> None:
        """Create ``notify_trigger_sql``'s triggers for ``workers`` (default: all)."""
        self._wake_wiring.create_triggers(workers)

    def _runner(self) -> ProcessRunner:
        """What runs in each handler process (the executors start it there)."""
        config = ChildConfig(self.database_url, self.engine_options, type(self._dialect))
        workers = [(w.name, w.source, w.keyed) for w in self._workers.values()]
        return ProcessRunner(config, workers)

    def drain(
        self,
        *,
        workers: Iterable[str] | None = None,
        max_invocations: int = DEFAULT_MAX_INVOCATIONS,
    ) -> DrainReport:
        """Run every currently eligible item to completion in this process, and say what ran.

        For tests of the application: no processes and no waiting. Runs until no
        worker can claim anything, including items that become eligible as others
        finish. Not while the coordinator is started.
        """
        with self._lock:
            self._check_not_started("drain()")
            chosen = [self._registration(name) for name in (workers or self._workers)]
            for worker in chosen:
                worker.eligible_query()
            self._tables.check_database_exists()
            with self.session_factory() as session:
                self._tables.check(session)
        engine = coordination_engine(self._url, self._dialect, self.engine_options)
        runner = self._runner()
        try:
            return drain(
                engine,
                self._dialect,
                runner,
                chosen,
                self._timings.lease_seconds,
                max_invocations,
                self._events,
            )
        finally:
            runner.dispose()
            engine.dispose()

    def stop(self, timeout: float | None = None, *, wait: bool = True) -> None:
        """Stop claiming and wait for running handlers to finish.

        With ``timeout``, handlers still running after that many seconds are killed
        and their items released so any coordinator can claim them at once. With
        ``wait=False`` it only asks (no new claims from now on) and returns; call
        ``wait()`` or ``stop()`` later.
        """
        check_stop_timeout(timeout)
        scheduler = self._scheduler
        if scheduler is None:
            return
        if not self._stopped:
            log.debug("coordinator stopping (timeout %s)", timeout)
        self._stopped = True
        scheduler.request_stop(timeout)
        if not wait:
            return
        if threading.current_thread() is not scheduler.thread:
            scheduler.thread.join()
        if self._engine is not None:
            if self._heartbeat is not None:
                self._heartbeat.stop()
                self._heartbeat = None
            self._engine.dispose()
            self._engine = None
            health = scheduler.health
            log.info(
                "coordinator stopped: %d item(s) claimed, %d invocation(s) completed",
                health.claimed,
                health.completed,
            )
        forget(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the coordinator has stopped, or ``timeout`` seconds; True if stopped."""
        scheduler = self._scheduler
        if scheduler is None:
            return True
        scheduler.thread.join(timeout)
        return not scheduler.thread.is_alive()

    @property
    def running(self) -> bool:
        return self._scheduler is not None and self._scheduler.thread.is_alive()

    def health(self) -> Health:
        """A snapshot of the scheduler's health: running, database reachable, the last error."""
        if self._scheduler is None:
            return Health()
        return Health.of(self._scheduler.health)

    def __enter__(self) -> Coordinator:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- status ----------------------------------------------------------------------------

    def execution_status(
        self, session: Session, *, worker: str, source_id: Any
    ) -> ExecutionStatus | None:
        """The status of ``source_id`` under ``worker``; None before its first claim."""
        return self._registration(worker).status(session, source_id)

    def cancel(self, session: Session, *, worker: str, source_id: Any) -> bool:
        """Cancel an open item in ``session``'s transaction (``dbworker.cancellation``):
        FAILED (``dbworker.Cancelled``) at commit, its handler stopped; False for a
        FINISHED or FAILED item."""
        return self._cancellation.cancel(session, worker, source_id)

    def has_execution_status(
        self, *, worker: str, source_id: Any, statuses: Iterable[ExecutionStatus]
    ) -> Any:
        """A SQL condition: ``worker`` has one of ``statuses`` for ``source_id``.

        Use it in ``where()``, including inside another worker's ``eligible``.
        """
        return self._registration(worker).has_status(source_id, statuses)


__all__ = ["Coordinator", "DBWorkerError"]
