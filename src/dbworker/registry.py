"""The coordinator registry: every running coordinator keeps a row with a heartbeat.

A coordinator inserts its row at start, renews ``heartbeat_at`` (the database's clock)
every ``HEARTBEAT_SECONDS`` and deletes it on a clean stop. A row whose heartbeat is
older than ``STALE_AFTER`` heartbeats belongs to a coordinator that vanished (killed,
its host gone): it is shown as stale, and any coordinator's heartbeat deletes it once
it is ``REAP_AFTER_SECONDS`` old. The heartbeat runs on its own thread, off the
scheduling loop, and its transactions touch only this table.

The same thread refreshes the figures that are expensive to count (``dbworker.backlog``)
into its row's ``stats``, when no other live coordinator's are fresh, so that
``dbworker status`` and the dashboard answer at once on a large table.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Table, delete, insert, select, update

from .backlog import db_now, measure
from .dialects import Dialect
from .dialects.base import READ_ONLY_OPTION

# Re-exported: the read side (overview, CLI, dashboard) reaches the schema through here.
from .schema import has_table as has_table
from .worker import Registration

log = logging.getLogger("dbworker")

HEARTBEAT_SECONDS = 5.0
#: Missed heartbeats after which a coordinator is shown as stale.
STALE_AFTER = 3
#: A stale row is deleted once its last heartbeat is this old.
REAP_AFTER_SECONDS = 600.0
#: How often the expensive figures are refreshed (by one coordinator at a time)...
STATS_SECONDS = 10.0
#: ... or less often when measuring them is slow: the refresh then waits this many
#: times as long as the last one took, so the cache never keeps a database connection
#: busy more than 1/20 of the time (a 1 s count over a large table: every 20 s).
STATS_BACKOFF = 20.0
#: Cached figures older than this are not shown: status counts live instead.
STATS_MAX_AGE = 600.0
#: While this coordinator claims and completes nothing, its figures are refreshed only
#: this often: an idle coordinator's steady cost stays a few index probes, not counts
#: over the execution and source tables every STATS_SECONDS (rows no coordinator is
#: told of still show up within this, and every figure says how old it is).
STATS_IDLE_SECONDS = 300.0


def version() -> str:
    try:
        return importlib.metadata.version("dbworker")
    except importlib.metadata.PackageNotFoundError:  # a source tree, not installed
        return "unknown"


@dataclass(frozen=True, slots=True)
class Timing:
    """The registry's periods; tests shorten them."""

    heartbeat: float = HEARTBEAT_SECONDS
    stale_after: int = STALE_AFTER
    reap_after: float = REAP_AFTER_SECONDS
    stats: float = STATS_SECONDS

    @property
    def stale_seconds(self) -> float:
        return self.heartbeat * self.stale_after


def describe_workers(workers: Iterable[Registration]) -> list[dict[str, Any]]:
    return [
        {"name": w.name, "concurrency": w.concurrency, "executor": type(w.executor).__name__}
        for w in workers
    ]


def _read_only(engine: Engine) -> Connection:
    # On SQLite a plain BEGIN: a WAL reader waits for nobody and blocks no claim.
    return engine.connect().execution_options(**{READ_ONLY_OPTION: True})


def list_coordinators(
    conn: Connection, dialect: Dialect, table: Table, timing: Timing = Timing()
) -> list[dict[str, Any]]:
    """Every registered coordinator, oldest first, with ``stale`` and ``heartbeat_age``."""
    now = db_now(conn, dialect)
    rows = conn.execute(select(table).order_by(table.c.started_at, table.c.id)).mappings().all()
    found = []
    for row in rows:
        age = max(0.0, now - row["heartbeat_at"])
        found.append(
            {
                "id": row["id"],
                "host": row["host"],
                "pid": row["pid"],
                "version": row["version"],
                "workers": json.loads(row["workers"]),
                "database": row["database"],
                "started_at": row["started_at"],
                "heartbeat_at": row["heartbeat_at"],
                "heartbeat_age": age,
                "uptime": max(0.0, now - row["started_at"]),
                "stale": age > timing.stale_seconds,
            }
        )
    return found


def cached_stats(
    conn: Connection, dialect: Dialect, table: Table, timing: Timing = Timing()
) -> tuple[dict[str, Any], float] | None:
    """The freshest stats a live coordinator refreshed: (per worker, age in seconds)."""
    now = db_now(conn, dialect)
    row = conn.execute(
        select(table.c.stats, table.c.stats_at)
        .where(table.c.stats_at.is_not(None), table.c.heartbeat_at >= now - timing.stale_seconds)
        .order_by(table.c.stats_at.desc())
        .limit(1)
    ).first()
    if row is None or row.stats is None:
        return None
    return json.loads(row.stats), max(0.0, now - row.stats_at)


class Heartbeat:
    """One coordinator's row in the registry, kept alive by a thread of its own."""

    def __init__(
        self,
        engine: Engine,
        dialect: Dialect,
        table: Table,
        workers: list[Registration],
        database: str,
        timing: Timing = Timing(),
        on_error: Callable[[BaseException], None] | None = None,
        activity: Callable[[], int] | None = None,
    ) -> None:
        self.engine = engine
        self.dialect = dialect
        self.table = table
        self.workers = workers
        self.timing = timing
        self.id = uuid.uuid4().hex
        self._row = {
            "id": self.id,
            "host": socket.gethostname()[:255],
            "pid": _pid(),
            "version": version()[:64],
            "workers": json.dumps(describe_workers(workers)),
            "database": database[:255],
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dbworker-heartbeat", daemon=True)
        self._on_error = on_error
        self._failing = False
        self._next_stats = 0.0
        self._interval = timing.stats
        #: A count that moves whenever this coordinator claims or completes an item,
        #: and its value at the last refresh (None: refresh on the interval alone).
        self._activity = activity
        self._activity_seen: int | None = None
        self._refreshed_at = float("-inf")
        #: The latest expensive figures, this coordinator's or another's, with when
        #: (``time.monotonic()``) they were measured: for the metrics' gauges.
        self.latest: tuple[dict[str, Any], float] | None = None

    def start(self) -> None:
        """Register (in the caller's thread, so that a start-up error is raised here)."""
        with self.engine.begin() as conn:
            now = self.dialect.now()
            conn.execute(insert(self.table).values(**self._row, started_at=now, heartbeat_at=now))
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and delete the row: a clean stop leaves no trace."""
        self._stop.set()
        if self._thread.is_alive():
            # Bounded: a slow count over a large table must not hold up a stop. Its
            # late write then matches no row, and the thread beats no more.
            self._thread.join(timeout=2 * self.timing.heartbeat)
        try:
            with self.engine.begin() as conn:
                conn.execute(delete(self.table).where(self.table.c.id == self.id))
        except Exception as exc:  # the database is down: the row goes stale and is reaped
            log.warning("dbworker: could not remove this coordinator's registry row: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.timing.heartbeat):
            try:
                self.beat()
                if time.monotonic() >= self._next_stats and self._worth_refreshing():
                    began = time.monotonic()
                    self.refresh_stats()
                    self._refreshed_at = time.monotonic()
                    took = self._refreshed_at - began
                    self._interval = max(self.timing.stats, STATS_BACKOFF * took)
                    self._next_stats = time.monotonic() + self._interval
                if self._failing:
                    log.info("dbworker: registry heartbeat reaches the database again")
                self._failing = False
            except Exception as exc:
                # The scheduler reports outages; the heartbeat only says it once.
                if not self._failing:
                    log.warning("dbworker: registry heartbeat failed: %s", exc)
                self._failing = True
                if self._on_error is not None:
                    self._on_error(exc)

    def _worth_refreshing(self) -> bool:
        """Whether the figures may have changed: this coordinator did something since
        the last refresh, or that refresh is STATS_IDLE_SECONDS old."""
        if self._activity is None:
            return True
        seen, self._activity_seen = self._activity_seen, self._activity()
        moved = seen is None or seen != self._activity_seen
        return moved or time.monotonic() - self._refreshed_at >= STATS_IDLE_SECONDS

    def beat(self) -> None:
        table = self.table
        with self.engine.begin() as conn:
            now = self.dialect.now()
            updated = conn.execute(
                update(table).where(table.c.id == self.id).values(heartbeat_at=now)
            ).rowcount
            if not updated:
                # Reaped while the database was out of reach for longer than
                # REAP_AFTER: this coordinator is alive, so it registers again.
                conn.execute(insert(table).values(**self._row, started_at=now, heartbeat_at=now))
            conn.execute(delete(table).where(table.c.heartbeat_at < now - self.timing.reap_after))

    def refresh_stats(self, force: bool = False) -> bool:
        """Measure the expensive figures unless another live coordinator's are fresh."""
        with _read_only(self.engine) as conn:
            if not force:
                cached = cached_stats(conn, self.dialect, self.table, self.timing)
                if cached is not None and cached[1] < self._interval:
                    self.latest = (cached[0], time.monotonic() - cached[1])
                    return False
            stats = {w.name: measure(conn, self.dialect, w) for w in self.workers}
            conn.rollback()
        self.latest = (stats, time.monotonic())
        with self.engine.begin() as conn:
            conn.execute(
                update(self.table)
                .where(self.table.c.id == self.id)
                .values(stats=json.dumps(stats), stats_at=self.dialect.now())
            )
        return True


def _pid() -> int:
    import os

    return os.getpid()


def banner(workers: Iterable[Registration], database: str) -> str:
    """The start-up log line: what runs where (``database`` with its password masked)."""
    described = ", ".join(
        f"{w['name']} (concurrency {w['concurrency']}, {w['executor']})"
        for w in describe_workers(workers)
    )
    return (
        f"coordinator started: dbworker {version()} on {socket.gethostname()} pid {_pid()}, "
        f"database {database}, workers {described}"
    )


def log_started(workers: Iterable[Registration], database: str) -> None:
    """Log each worker's settings (debug) and the start-up banner."""
    for worker in workers:
        log.debug(
            "worker started: concurrency %d, executor %r, timeout %s, retry %s, max_crashes %d",
            worker.concurrency,
            worker.executor,
            worker.timeout,
            worker.retry,
            worker.max_crashes,
            extra={"worker": worker.name},
        )
    log.info("%s", banner(workers, database))


def start_heartbeat(
    engine: Engine,
    dialect: Dialect,
    table: Table,
    workers: list[Registration],
    database: str,
    timing: Timing,
    activity: Callable[[], int] | None = None,
) -> Heartbeat | None:
    """Register this coordinator; None (and a warning) when the registry cannot be used.

    The registry is for operators: a deployment whose migrations predate it keeps
    working, only invisible to ``dbworker coordinators`` until the table exists.
    """
    try:
        with _read_only(engine) as conn:
            present = has_table(conn, table)
        if not present:
            log.warning(
                "dbworker: the table %s does not exist, so this coordinator is not listed "
                "by `dbworker coordinators`; run `dbworker create-tables` (or your migrations)",
                table.name,
            )
            return None
        heartbeat = Heartbeat(engine, dialect, table, workers, database, timing, activity=activity)
        heartbeat.start()
    except Exception as exc:
        log.warning("dbworker: could not register this coordinator: %s", exc)
        return None
    return heartbeat
