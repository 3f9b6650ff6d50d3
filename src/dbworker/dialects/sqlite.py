"""SQLite: one writer at a time, so a claim takes the write lock up front."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Float,
    Integer,
    Select,
    Table,
    cast,
    event,
    func,
    literal,
    update,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.dml import Insert

from ..core.errors import ConfigurationError
from ..core.policy import Decision
from .base import Dialect
from .driver_cursor import statements_alone
from .open_first import (
    CrossJoin,
    claimed,
    implies_open,
    in_direction,
    key_direction,
    limit_key,
    open_index,
    pin_open_records,
    reuse,
)
from .sqlite_turns import BUSY_TIMEOUT_INFO, take_turns, turn_for_one_statement
from .terms import READ_ONLY_OPTION, Claim, Owner, WorkerTable, claim_columns

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
    # Under the write lock BEGIN IMMEDIATE took, a claim in key order searches and
    # updates in one UPDATE ... RETURNING (SQLite 3.35+).
    supports_one_statement_claims: ClassVar[bool] = True
    # The handler's transaction holds the only write lock: keep the row's read out of it.
    source_read_apart: ClassVar[bool] = True
    # A commit is cheap here (WAL, no round trip) and a group would hold the only write
    # lock for the whole group: claims and the other processes wait (8% fewer items/s).
    supports_group_commit: ClassVar[bool] = False
    # One writer: a group's transaction would hold the write lock while its handlers
    # run; the FINISHes of items that wrote nothing take it once, for one statement.
    groups_lone_finishes: ClassVar[bool] = True
    # One writer: a round run ahead took the write lock from the handler processes'
    # FINISHes (a backlog of 12,000 drained at 0.85-0.90x), and without it, rounds of
    # 250 held claims up more often than rounds of 1,000 (0.88x at 3,000 items).
    discovers_ahead: ClassVar[bool] = False
    discovery_batch: ClassVar[int] = 1000
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

    def identity(self, url: URL) -> str:
        return f"sqlite:{_file_path(url)}"

    def whole_minutes(self, seconds: ColumnElement[float]) -> ColumnElement[Any]:
        # floor() is not built into every SQLite; for a non-negative number truncating
        # to an integer is the same.
        return cast(seconds / 60, Integer)

    def db_now(self) -> ColumnElement[float]:
        # julianday() has millisecond resolution and is fixed for one statement.
        return ((func.julianday(literal("now")) - 2440587.5) * 86400.0).cast(Float())

    def insert_ignore(self, table: Table, keys: Sequence[str] = ("source_id",)) -> Insert:
        return sqlite_insert(table).on_conflict_do_nothing(index_elements=list(keys))

    # A woken poll's discovery in one statement: pickup p50 2.3-2.5 -> 1.9-2.1 ms.
    watermark_read_in_insert: ClassVar[bool] = True

    def _discover_above_watermark(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        # The keys above the watermark go from the source table into pending records
        # in one statement: sent back as parameters, each row cost the coordinator a
        # parameter set to build and bind, under the write lock every writer waits
        # for. (SQLite has no row locks: the application's rows stay as free as before.)
        # The SELECT ends in ORDER BY ... LIMIT, so SQLite cannot read the upsert's ON
        # as a join's (the ambiguity its documentation warns of for INSERT ... SELECT).
        return self._discover_in_one_insert(conn, worker)

    # -- claiming ------------------------------------------------------------------------

    def candidates(
        self, worker: WorkerTable, eligible: Select[Any], limit: int, now: ColumnElement[float]
    ) -> Select[Any]:
        table = worker.table
        claimable = self.claimable(table, now)
        query = eligible.with_only_columns(*claim_columns(table), maintain_column_froms=True)
        # SQLite's planner walks the source table in ORDER BY order through the whole
        # history when its statistics (or their absence) make open work look common;
        # CROSS JOIN pins the execution table, read through an open-records index, as
        # the outer loop.
        #
        # Which open-records index is the planner's choice otherwise: with no statistics
        # it takes the (status, source_id) index for the status test and sorts every
        # open record through a temporary B-tree (2.7 ms a claim with 19k open records,
        # 0.16 with 1k). INDEXED BY reads the key-ordered one, which serves key order
        # and stops at the limit. SQLite refuses the hint (an error) unless the WHERE
        # clause has the index's predicate as a term, hence the test (a claim condition
        # of a subclass may not).
        index = open_index(table) if implies_open(claimable, table) else None
        query = pin_open_records(query, worker, CrossJoin, index).where(claimable)
        direction = key_direction(eligible, worker)
        if direction is not None:
            query = query.order_by(None).order_by(in_direction(table.c.source_id, direction))
        return query.limit(limit)

    def claim(
        self,
        conn: Connection,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> list[Claim]:
        if worker.limits is not None:
            return self.claim_limited(conn, worker, eligible, limit, lease_seconds, owner)
        direction = key_direction(eligible, worker)
        if (
            limit < 1
            or direction is None
            or not conn.dialect.update_returning
            or not self.supports_one_statement_claims
        ):
            # Two statements (search, then UPDATE by key): for other orders (RETURNING
            # cannot return the search's ORDER BY values, and comes back in no order),
            # before SQLite 3.35 (no RETURNING), or for a subclass that locks its own way.
            return super().claim(conn, worker, eligible, limit, lease_seconds, owner)
        statement, params = reuse(
            self,
            ("claim", worker.table, lease_seconds, owner),
            eligible,
            limit,
            lambda: self._claim_statement(worker, eligible, limit, lease_seconds, owner),
        )
        # On the driver's cursor: a claim of 30 took 0.34 ms through SQLAlchemy's
        # execution, 0.25 ms on the cursor, under the write lock.
        claims = claimed(self._rows_of(conn, statement, statement, params))
        # RETURNING has no order; in key order the key alone gives it back.
        claims.sort(key=lambda c: c.source_id, reverse=direction == "desc")
        return claims

    def _claim_statement(
        self,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> tuple[Any, str]:
        """UPDATE ... WHERE source_id IN (the search) RETURNING: one statement, under
        the write lock BEGIN IMMEDIATE took, so no other claim runs between its search
        and its update. The search reads an alias of the execution table, so that
        SQLAlchemy does not correlate it with the UPDATE's own table."""
        table = worker.table
        alias: Any = self._built_once(("open alias", table), lambda: table.alias("dbworker_open"))
        search = self.candidates(
            dataclasses.replace(worker, table=alias), eligible, limit, self.now()
        ).with_only_columns(alias.c.source_id)
        c = table.c
        statement = (
            update(table)
            .where(c.source_id.in_(search.scalar_subquery()))
            .ordered_values(*self._claim_values(table, lease_seconds, owner))
            .returning(c.source_id, c.token, c.attempts, c.failures, c.crashes)
        )
        return statement, limit_key(search)

    def configure_engine(self, engine: Engine, handlers: bool = False) -> None:
        self._configure(engine, handlers, turns=True)

    def configure_async_engine(self, engine: Engine) -> None:
        # No turns (a blocking file lock): the tasks of one event loop share its thread,
        # and one waiting for its turn would stop the one holding it. SQLite's busy
        # timeout waits in aiosqlite's thread instead.
        self._configure(engine, handlers=True, turns=False)

    def _configure(self, engine: Engine, handlers: bool, turns: bool) -> None:
        super().configure_engine(engine, handlers)

        @event.listens_for(engine, "do_connect")
        def _do_connect(_dialect: Any, record: Any, _cargs: Any, cparams: Any) -> None:
            # pysqlite's ``timeout`` is SQLite's busy timeout; keep the user's choice
            # (the URL's or connect_args'), and bound the wait for a turn by it too.
            cparams.setdefault("timeout", BUSY_TIMEOUT_MS / 1000)
            with contextlib.suppress(TypeError, ValueError):
                record.info[BUSY_TIMEOUT_INFO] = float(cparams["timeout"])

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
                if not handlers:
                    # The claims' materialized searches and sorts are a few dozen rows:
                    # in memory, not in temporary files (with handler processes at work
                    # beside it, an exclusive_by claim's statement took 0.98 ms, 0.55 so).
                    # Not on handler connections: they run the application's queries.
                    cursor.execute("PRAGMA temp_store = MEMORY")
            finally:
                cursor.close()

        # Registered before BEGIN IMMEDIATE below, so a connection has its turn first.
        if turns:
            take_turns(engine, _file_path(engine.url), self._busy_timeout(engine), patient=handlers)

        @event.listens_for(engine, "begin")
        def _begin(connection: Any) -> None:
            # A read transaction: WAL readers take no lock and wait for nobody.
            read = connection.get_execution_options().get(READ_ONLY_OPTION)
            statement = "BEGIN" if read else "BEGIN IMMEDIATE"
            # On the driver's connection: through SQLAlchemy's execution (events,
            # result set-up) the two BEGINs were a tenth of a short item's handler.
            try:
                connection.connection.dbapi_connection.execute(statement)
            except sqlite3.Error as exc:
                raise DBAPIError.instance(statement, (), exc, sqlite3.Error) from exc

    def record_alone(
        self,
        conn: Connection,
        worker: WorkerTable,
        source_id: Any,
        token: int,
        decision: Decision,
    ) -> bool:
        # The driver connection autocommits (see _connect): the fenced UPDATE is its own
        # transaction, without BEGIN IMMEDIATE and COMMIT, so the write lock is held for
        # that one statement (the lock, not CPU, bounds how fast short items finish).
        with _one_statement(conn):
            return self.record(conn, worker, source_id, token, decision)

    def finish_all_alone(
        self, conn: Connection, worker: WorkerTable, held: Sequence[tuple[Any, int]]
    ) -> set[Any]:
        # As record_alone: one autocommitted statement, the write lock held for it alone.
        with _one_statement(conn):
            return self.finish_all_returning(conn, worker, held)

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


@contextlib.contextmanager
def _one_statement(conn: Connection) -> Iterator[None]:
    """Within it, a statement on ``conn`` (in no transaction) is a transaction of its
    own: under the write turn, on the autocommitting driver connection, committed after
    if something began a transaction around it all the same."""
    with turn_for_one_statement(conn), statements_alone(conn):
        yield
        if conn.in_transaction():  # SQLAlchemy's execution began one (someone watches)
            conn.commit()
        driver = conn.connection.dbapi_connection
        if driver is not None and driver.in_transaction:
            # pysqlite began one itself (an engine this dialect did not configure)
            driver.commit()
