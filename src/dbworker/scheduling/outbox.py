"""Database access that survives outages: transactions that report instead of raising,
and an outbox of transitions retried, in order, until the database accepts them."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from ..core.errors import ClaimContention
from ..dialects import Dialect
from ..dialects.base import READ_ONLY_OPTION
from ..events import Event, EventKind, Events

log = logging.getLogger("dbworker")

#: Wait after a database error before trying again (doubling up to the cap).
DB_RETRY_SECONDS = 0.5
DB_RETRY_MAX_SECONDS = 10.0
#: Contention is retried after a random wait up to this (apart from the next claimer).
CONTENTION_RETRY_SECONDS = 0.05


@dataclass(slots=True)
class SchedulerHealth:
    """The scheduler's health, as it changes (``Coordinator.health()`` copies it)."""

    running: bool = False
    database_ok: bool = True
    last_error: str | None = None
    last_error_at: float | None = None
    claimed: int = 0
    completed: int = 0
    #: Coordination transactions that lost to concurrent ones (retried, not errors).
    contention: int = 0
    #: Set if the scheduler itself stopped on an unexpected error (a bug).
    crashed: str | None = None


class Deferred(Exception):
    """A database step did not happen now; the loop carries on and tries later."""


@dataclass(slots=True)
class PendingWrite:
    """A transition the database has not accepted yet (it was down): retried each pass."""

    description: str
    apply: Callable[[Connection], object]
    #: The item the write concerns (worker, source_id, attempt), for its log records.
    extra: dict[str, Any] | None = None


class Outbox:
    def __init__(
        self,
        engine: Engine,
        dialect: Dialect,
        health: SchedulerHealth,
        events: Events | None = None,
    ) -> None:
        self.engine = engine
        self.dialect = dialect
        self.health = health
        self.events = events if events is not None else Events()
        self.pending: list[PendingWrite] = []
        self._wait = 0.0
        #: No transaction is tried before this (``time.monotonic()``) after an error.
        self.blocked_until = 0.0
        #: The scheduler thread's connection, kept between its transactions: a checkout
        #: and a checkin per transaction cost 40 us on SQLite and 65-170 us on
        #: PostgreSQL and MariaDB, on the path from a wake-up to a claim. Dropped after
        #: any error, so that the next transaction starts from a connection the pool
        #: has checked.
        self._conn: Connection | None = None

    def transaction(
        self,
        description: str,
        action: Callable[[Connection], Any],
        extra: dict[str, Any] | None = None,
        *,
        read_only: bool = False,
    ) -> Any:
        """Run ``action`` in one transaction; on a database error log it and raise Deferred.

        ``extra`` names the item the transaction is about, for the log records.
        ``read_only`` transactions take no write lock (SQLite begins them deferred).
        """
        if time.monotonic() < self.blocked_until:
            raise Deferred
        try:
            conn = self._conn
            if conn is None:
                conn = self._conn = self.engine.connect()
                self.dialect.scheduler_connection(conn)
            if conn.get_execution_options().get(READ_ONLY_OPTION, False) != read_only:
                # In place (SQLAlchemy 2): the option stays until it is set again.
                conn.execution_options(**{READ_ONLY_OPTION: read_only})
            with conn.begin():
                result = action(conn)
        except Exception as exc:
            self.close()
            self._error(description, exc, extra)
            raise Deferred from exc
        if not self.health.database_ok:
            log.warning("dbworker: database reachable again (%s)", description, extra=extra)
        self.health.database_ok = True
        self._wait = 0.0
        return result

    def close(self) -> None:
        """Give the kept connection back to the pool (after an error, at the end)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                self.dialect.release_scheduler_connection(conn)
            with contextlib.suppress(Exception):
                conn.close()

    def _error(self, description: str, exc: Exception, extra: dict[str, Any] | None) -> None:
        if isinstance(exc, ClaimContention) or self.dialect.is_contention(exc):
            self._contention(description, exc, extra)
            return
        transient = self.dialect.is_transient(exc)
        if self.health.database_ok or not transient:
            # Once per incident: the first error of an outage, and every non-transient one.
            log.error(
                "dbworker: database error while %s (%s); retrying",
                description,
                "transient" if transient else "not transient",
                exc_info=exc,
                extra=extra,
            )
        self.health.database_ok = False
        self.health.last_error = f"{type(exc).__name__}: {exc}"[:2000]
        self.health.last_error_at = time.time()
        if self.events:
            worker = extra.get("worker") if extra else None
            self.events.emit(Event(EventKind.DATABASE_ERROR, worker, error=self.health.last_error))
        self._wait = min(max(self._wait * 2, DB_RETRY_SECONDS), DB_RETRY_MAX_SECONDS)
        self.blocked_until = time.monotonic() + self._wait

    def _contention(self, description: str, exc: Exception, extra: dict[str, Any] | None) -> None:
        """Lost to a concurrent transaction (a deadlock, a Galera certification conflict):
        counted, logged at debug level, tried again after a short wait. The database is
        fine, so nothing else waits for it."""
        self.health.contention += 1
        log.debug("dbworker: contention while %s (%s); trying again", description, exc)
        if self.events:
            worker = extra.get("worker") if extra else None
            self.events.emit(Event(EventKind.CONTENTION, worker, error=str(exc)[:2000]))
        self.blocked_until = time.monotonic() + random.uniform(0, CONTENTION_RETRY_SECONDS)

    def write(
        self,
        description: str,
        apply: Callable[[Connection], object],
        extra: dict[str, Any] | None = None,
    ) -> None:
        """A transition that must land eventually, in order, even across an outage."""
        self.pending.append(PendingWrite(description, apply, extra))
        self.flush()

    def flush(self) -> None:
        while self.pending:
            write = self.pending[0]
            try:
                self.transaction(write.description, write.apply, write.extra)
            except Deferred:
                return
            self.pending.pop(0)
