"""What the kit must know of each kind of database server to set up its connections.

None of it is checked: it only makes a lock wait end quickly, so that a broken dialect
fails a check instead of hanging it, and lets the state machine (which acts in one
thread, where a lock wait on another of its own transactions could never end) tell a
lock wait from other errors and wait for a dropped connection's session to go away.

``SERVERS`` is keyed by SQLAlchemy dialect name (``engine.dialect.name``). A third party
whose database speaks like a built-in one points its name at that entry
(``SERVERS["cockroachdb"] = SERVERS["postgresql"]``), or adds a ``Server`` of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, event
from sqlalchemy.exc import DBAPIError


@dataclass(frozen=True)
class Server:
    #: SQL that bounds this session's lock waits to a number of seconds.
    lock_timeout: Callable[[float], str]
    #: SQL the state machine runs on each new connection: a lock wait fails (almost) at
    #: once, and commits skip what a crash of the server would need (steps are many).
    machine_session: tuple[str, ...]
    #: Whether the driver runs those statements in a transaction that must be committed.
    commit_session: bool
    #: SQL for the connection's server session id; None where closing a connection ends
    #: its session at once (an embedded database).
    session_id: str | None
    #: SQL counting the live sessions whose id is ``{id}``, formatted in.
    sessions_with_id: str | None
    #: Whether an error is a lock wait that timed out.
    is_lock_wait: Callable[[DBAPIError], bool]
    #: ``lock_timeout`` for one transaction, for a connection through a transaction
    #: pooler, where a session setting would stay on a server connection other clients
    #: get (None: the server is not used behind one).
    lock_timeout_local: Callable[[float], str] | None = None
    #: Whether a unique index's duplicate check locks a range of it (InnoDB's next-key
    #: locks): another transaction's write of a different value there may then wait.
    unique_checks_lock_ranges: bool = False
    #: Driver connect arguments bounding a new connection's lock waits to a number of
    #: seconds, for what reads them there rather than from ``lock_timeout``'s SQL (the
    #: SQLite dialect's turns at the write lock); None: none are needed.
    lock_timeout_connect_args: Callable[[float], dict[str, Any]] | None = None


def _sqlstate(error: DBAPIError) -> str | None:
    return getattr(error.orig, "sqlstate", None)


def _mysql_code(error: DBAPIError) -> object:
    orig = error.orig
    return orig.args[0] if orig is not None and orig.args else None


POSTGRESQL = Server(
    lock_timeout=lambda seconds: f"SET lock_timeout = '{round(seconds * 1000)}ms'",
    lock_timeout_local=lambda seconds: f"SET LOCAL lock_timeout = '{round(seconds * 1000)}ms'",
    machine_session=(
        # 0 would mean "wait forever"; any wait here is on a lock that cannot be
        # released while this thread waits, so the length does not matter.
        "SET lock_timeout = '10ms'",
        # Commits stay atomic and visible at once; only durability across a server
        # crash is traded for not waiting for a WAL flush per step.
        "SET synchronous_commit = off",
    ),
    # psycopg runs the SETs in an implicit transaction; a rollback at pool check-in
    # would undo them.
    commit_session=True,
    session_id="SELECT pg_backend_pid()",
    sessions_with_id="SELECT count(*) FROM pg_stat_activity WHERE pid = {id:d}",
    is_lock_wait=lambda error: _sqlstate(error) == "55P03",  # lock_not_available
)
MYSQL = Server(
    # Whole seconds only; 1 is the minimum.
    lock_timeout=lambda seconds: f"SET SESSION innodb_lock_wait_timeout = {max(1, round(seconds))}",
    # The minimum: 0 would be "no wait", but MariaDB 10.11 then fails every SKIP
    # LOCKED read that meets a locked row (error 1180), which is not how dbworker
    # runs. Only findings wait, so the second is rarely spent.
    machine_session=("SET SESSION innodb_lock_wait_timeout = 1",),
    commit_session=True,
    session_id="SELECT CONNECTION_ID()",
    # A MariaDB session leaves the process list only after rolling back. (Not
    # information_schema.innodb_trx: it is a cache that polling keeps stale.)
    sessions_with_id="SELECT count(*) FROM information_schema.processlist WHERE id = {id:d}",
    is_lock_wait=lambda error: _mysql_code(error) == 1205,
    unique_checks_lock_ranges=True,
)
SQLITE = Server(
    lock_timeout=lambda seconds: f"PRAGMA busy_timeout = {round(seconds * 1000)}",
    # pysqlite's busy timeout, which the dialect's turns at the write lock wait for too.
    lock_timeout_connect_args=lambda seconds: {"timeout": seconds},
    machine_session=(
        # Replaces the dialect's busy timeout: a second writer is a bug in the
        # machine's preconditions and should fail, not hang for 30 s.
        "PRAGMA busy_timeout = 0",
        # WAL stays on; NORMAL skips an fsync per commit (still crash-safe in WAL
        # mode), which is most of SQLite's cost per step.
        "PRAGMA synchronous = NORMAL",
    ),
    commit_session=False,
    # Closing the connection releases its lock synchronously.
    session_id=None,
    sessions_with_id=None,
    is_lock_wait=lambda error: "locked" in str(error.orig).lower(),
)

#: The servers the kit knows, by SQLAlchemy dialect name.
SERVERS: dict[str, Server] = {
    "postgresql": POSTGRESQL,
    "mysql": MYSQL,
    "mariadb": MYSQL,
    "sqlite": SQLITE,
}


def server(name: str) -> Server:
    """The server behind SQLAlchemy dialect ``name``, or a ``LookupError`` saying how to
    describe it."""
    try:
        return SERVERS[name]
    except KeyError:
        raise LookupError(
            f"the kit does not know the {name!r} database server: add "
            f"dbworker.testing.SERVERS[{name!r}] (an existing entry, or a Server)"
        ) from None


def per_transaction(conn: Connection, statement: str) -> None:
    """Run ``statement`` first in each transaction ``conn`` begins (a ``SET LOCAL``), on
    the driver's cursor before the transaction's first statement: for a connection
    through a transaction pooler, whose transactions may each run on another server
    connection. Needs a driver that reports the transaction status (psycopg)."""

    @event.listens_for(conn, "before_cursor_execute")
    def _first(
        _conn: Connection, cursor: Any, _sql: str, _params: Any, _context: Any, _many: bool
    ) -> None:
        dbapi_connection = cursor.connection
        if getattr(dbapi_connection, "autocommit", False):
            return
        status = getattr(getattr(dbapi_connection, "info", None), "transaction_status", None)
        if status is not None and int(status) == 0:  # IDLE: this statement begins one
            cursor.execute(statement)
