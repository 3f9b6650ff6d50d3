"""PostgreSQL through a transaction-pooling proxy (PgBouncer ``pool_mode=transaction``).

Such a pooler hands each transaction to whichever server connection is free, so nothing
may outlive a transaction on the server: no session ``SET``, no session advisory lock,
no ``LISTEN``, no temporary table, no server-side prepared statement. dbworker's SQL
keeps none through a pooler (its planner settings are ``set_config(..., true)``,
transaction-local; only without one does the scheduler's own connection keep them for
its session, ``PostgreSQLDialect.scheduler_connection``; wake-ups listen on a
connection of their own, ``Coordinator(listen_url=...)``), but psycopg 3 prepares a
statement on the server after its fifth execution on a connection, under a name the
next client of that server connection may use too (``DuplicatePreparedStatement``), or
may not find (``InvalidSqlStatementName``).

Two ways to switch it off, per connection:

- detection, on every engine dbworker creates (the coordinator's, the handler
  processes'): a pooler answers the start-up with a backend pid of its own, which is
  not the pid of the server process running the connection's queries;
- ``?plugin=dbworker_pooled`` on the URL, for every engine made from it, the
  application's included (SQLAlchemy loads the plugin by name from its entry point).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import URL, CreateEnginePlugin

#: ``PoolProxiedConnection.info`` key: the connection goes through a pooler.
POOLED = "dbworker_pooled"
#: The URL plugin's name (``?plugin=dbworker_pooled``).
PLUGIN = "dbworker_pooled"


def goes_through_pooler(dbapi_connection: Any) -> bool:
    """Whether the backend pid the connection was given at start-up is not the pid of
    the server process that runs its queries (a pooler answered the start-up)."""
    info = getattr(dbapi_connection, "info", None)
    backend_pid = getattr(info, "backend_pid", None)
    if backend_pid is None:
        return False
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    finally:
        cursor.close()
    if not getattr(dbapi_connection, "autocommit", False):
        # The query began a transaction: end it, so that the pooler frees the server
        # connection and the pool receives the connection as it was.
        dbapi_connection.rollback()
    return bool(pid != backend_pid)


def _pooled(dbapi_connection: Any, record: Any) -> None:
    if hasattr(dbapi_connection, "prepare_threshold"):
        # psycopg 3: never prepare on the server (None: not even after N executions).
        dbapi_connection.prepare_threshold = None
    if record is not None:
        record.info[POOLED] = True


def detect_pooler(engine: Engine) -> None:
    """On each new connection of ``engine``, find out whether it goes through a pooler
    and if so switch off what a pooler cannot carry (one query per connection)."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        if record is not None and record.info.get(POOLED):
            return
        if goes_through_pooler(dbapi_connection):
            _pooled(dbapi_connection, record)


def is_pooled(conn: Connection) -> bool:
    """Whether ``conn`` goes through a pooler, as detection or the plugin found it."""
    return bool(conn.connection.info.get(POOLED))


class PooledPlugin(CreateEnginePlugin):
    """``?plugin=dbworker_pooled``: every connection of the engine is treated as going
    through a transaction pooler (no server-side prepared statements), without asking."""

    def update_url(self, url: URL) -> URL:
        return url

    def engine_created(self, engine: Engine) -> None:
        event.listen(engine, "connect", _pooled)
