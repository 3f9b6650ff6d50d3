"""SQLite: one writer at a time, so a claim takes the write lock up front."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Engine, Float, Select, Table, event, func, literal
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.sql.dml import Insert

from ..core.errors import ConfigurationError
from .base import Dialect, WorkerTable, claim_columns
from .open_first import CrossJoin, in_direction, key_direction, pin_open_records
from .sqlite_turns import take_turns

#: How long a connection waits for the write lock before SQLITE_BUSY, unless the
#: engine's options say otherwise (``connect_args={"timeout": seconds}`` or
#: ``?timeout=seconds`` in the URL, as for any pysqlite engine).
BUSY_TIMEOUT_MS = 30_000


def is_memory_url(url: URL) -> bool:
    database = url.database or ""
    return (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or "mode=memory" in database
        or url.query.get("mode") == "memory"
    )


class SQLiteDialect(Dialect):
    backend_names: ClassVar[tuple[str, ...]] = ("sqlite",)
    # SQLAlchemy silently drops FOR UPDATE on SQLite; exclusivity comes from the
    # database-wide write lock that BEGIN IMMEDIATE takes instead.
    supports_concurrent_claims: ClassVar[bool] = False
    #: ``PRAGMA synchronous`` on dbworker's own connections (FULL: sync every commit).
    synchronous: ClassVar[str] = "NORMAL"

    def validate_url(self, url: URL) -> None:
        if is_memory_url(url):
            raise ConfigurationError(
                "an in-memory SQLite database cannot be shared with worker processes; "
                "use a file-backed database such as sqlite:///work.db"
            )

    def same_database(self, ours: URL, theirs: URL) -> bool:
        # A file, whatever the spelling of its path (relative, URI filename).
        return _file_path(ours) == _file_path(theirs)

    def db_now(self) -> ColumnElement[float]:
        # julianday() has millisecond resolution and is fixed for one statement.
        return ((func.julianday(literal("now")) - 2440587.5) * 86400.0).cast(Float())

    def insert_ignore(self, table: Table) -> Insert:
        return sqlite_insert(table).on_conflict_do_nothing(index_elements=["source_id"])

    def candidates(
        self, worker: WorkerTable, eligible: Select[Any], limit: int, now: ColumnElement[float]
    ) -> Select[Any]:
        table = worker.table
        query = eligible.with_only_columns(*claim_columns(table), maintain_column_froms=True)
        # SQLite's planner walks the source table in ORDER BY order through the whole
        # history when its statistics (or their absence) make open work look common;
        # CROSS JOIN pins the execution table, read through an open-records index, as
        # the outer loop.
        query = pin_open_records(query, worker, CrossJoin).where(self.claimable(table, now))
        direction = key_direction(eligible, worker)
        if direction is not None:
            query = query.order_by(None).order_by(in_direction(table.c.source_id, direction))
        return query.limit(limit)

    def configure_engine(self, engine: Engine) -> None:
        super().configure_engine(engine)

        @event.listens_for(engine, "do_connect")
        def _do_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: Any) -> None:
            # pysqlite's ``timeout`` is SQLite's busy timeout; keep the user's choice.
            cparams.setdefault("timeout", BUSY_TIMEOUT_MS / 1000)

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            # pysqlite's own implicit BEGIN is deferred; turn it off and issue
            # BEGIN IMMEDIATE ourselves (below) so a transaction that will write
            # holds the lock from its first statement: an upgrade from a read
            # transaction can fail with SQLITE_BUSY without waiting.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                # WAL lets readers (the application, status queries) proceed
                # while a claim or a handler transaction writes.
                cursor.execute("PRAGMA journal_mode = WAL")
                # In WAL mode NORMAL syncs at checkpoints, not at every commit: a
                # crashed process loses nothing, a power cut may undo the last commits
                # (status and handler writes together, so the item runs again), and a
                # commit no longer waits for the disk.
                cursor.execute(f"PRAGMA synchronous = {self.synchronous}")
            finally:
                cursor.close()

        # Registered before BEGIN IMMEDIATE below, so a connection has its turn first.
        take_turns(engine, _file_path(engine.url), self._busy_timeout(engine))

        @event.listens_for(engine, "begin")
        def _begin(connection: Any) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    @staticmethod
    def _busy_timeout(engine: Engine) -> float:
        timeout = engine.url.query.get("timeout")
        try:
            return float(timeout) if isinstance(timeout, str) else BUSY_TIMEOUT_MS / 1000
        except ValueError:
            return BUSY_TIMEOUT_MS / 1000

    def is_transient(self, error: BaseException) -> bool:
        message = str(getattr(error, "orig", error)).lower()
        return "locked" in message or "busy" in message or super().is_transient(error)


def _file_path(url: URL) -> str:
    database = url.database or ""
    if database.startswith("file:"):  # a URI filename (uri=true)
        database = database[len("file:") :].split("?", 1)[0]
    return os.path.realpath(database) if database else ""
