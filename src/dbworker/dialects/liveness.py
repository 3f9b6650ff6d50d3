"""Checking a connection before use, but only after it has been idle.

SQLAlchemy's ``pool_pre_ping`` pings on every checkout: a round trip per
transaction, a large share of a busy coordinator's work (a claim every few
milliseconds) and of a one-invocation handler process's. A connection returned a
moment ago is as good as a ping; one idle for longer than ``IDLE_SECONDS`` is
pinged first and replaced if the ping finds it dead (a restarted server, a
proxy's or the server's idle timeout), before anyone uses it.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DisconnectionError

#: A connection idle for longer than this is pinged before it is used.
IDLE_SECONDS = 1.0
_RETURNED_AT = "dbworker_returned_at"
#: When a connection was last checked out or ended a transaction.
_USED_AT = "dbworker_used_at"
#: Engines whose connections another process used (and returned) at a known time.
_USED_ELSEWHERE: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()


def used_elsewhere(engine: Engine, at: float) -> None:
    """Record that ``engine``'s connections were in use until ``at`` (``time.monotonic()``)
    by another process sharing them: a forked process inherits the pool as its parent
    last saw it, while the connection may have served a sibling a moment ago."""
    _USED_ELSEWHERE[engine] = at


def ping_when_idle(engine: Engine, idle_seconds: float | None = None) -> None:
    """Ping ``engine``'s pooled connections at checkout when they have been idle."""

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_RETURNED_AT] = time.monotonic()

    def limit() -> float:
        return IDLE_SECONDS if idle_seconds is None else idle_seconds

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned_at = record.info.get(_RETURNED_AT)
        if returned_at is not None:
            returned_at = max(returned_at, _USED_ELSEWHERE.get(engine, returned_at))
        now = time.monotonic()
        if (
            returned_at is not None
            and now - returned_at >= limit()
            and not answers_ping(engine, dbapi_connection)
        ):
            # The pool discards this connection and checks out a new one.
            raise DisconnectionError("the pooled connection was closed while it idled")
        record.info[_USED_AT] = now

    # A connection kept checked out between transactions (a handler process keeps its
    # own from one invocation to the next, and a handler may end its transaction and
    # begin another) is checked the same way when a transaction begins after idling.
    # Invalidated here, before the BEGIN, it is replaced by the pool at once.
    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        info = conn.connection.info
        used_at = info.get(_USED_AT)
        now = time.monotonic()
        info[_USED_AT] = now
        if (
            used_at is not None
            and now - used_at >= limit()
            and not answers_ping(engine, conn.connection.dbapi_connection)
        ):
            conn.invalidate()

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _ended(conn: Connection) -> None:
        if not conn.invalidated:
            conn.connection.info[_USED_AT] = time.monotonic()


def answers_ping(engine: Engine, dbapi_connection: Any) -> bool:
    """Whether ``dbapi_connection`` (one of ``engine``'s) answers a ping; an error that
    is not a disconnection is raised."""
    dialect = engine.dialect
    try:
        return bool(dialect.do_ping(dbapi_connection))
    except dialect.loaded_dbapi.Error as exc:
        if not dialect.is_disconnect(exc, dbapi_connection, None):
            raise
        return False
