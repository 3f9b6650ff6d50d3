"""Connections a handler process inherited from the coordinator, kept out of its use.

A handler process forked from the coordinator (``executors/interpreter.py``) holds a
copy of every connection pool of the application: the coordinator's engine, and any
engine a handler's module made and the coordinator used before it started. A pooled
connection is one socket to one server session; used from two processes at once, each
reads the other's replies. dbworker's own statements never touch those pools, but a
handler may (a module-level engine, the application's own ``sessionmaker``). So each
handler process refuses, at checkout, every pooled connection it did not open itself,
and the pool opens a new one in its place (SQLAlchemy's recipe for pools across
``os.fork()``, for every pool of the process rather than one engine's).

A refused connection is kept referenced, never closed nor dropped: closing it, or a
driver's destructor doing so (mysqlclient's sends the server its goodbye), would end
the coordinator's session on the server.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.pool import Pool

#: Where a connection record notes the process that opened its connection.
_OPENED_BY = "dbworker_opened_by"
#: The inherited connections refused so far: kept alive until the process exits.
_refused: list[Any] = []


def refuse_inherited_connections() -> None:
    """From now on, this process's pools give out only connections it opened."""
    if not event.contains(Pool, "connect", _opened):
        event.listen(Pool, "connect", _opened)
        event.listen(Pool, "checkout", _refuse_inherited)


def _opened(dbapi_connection: Any, record: Any) -> None:
    record.info[_OPENED_BY] = os.getpid()


def _refuse_inherited(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    if record.info.get(_OPENED_BY) != os.getpid():
        _refused.append(dbapi_connection)
        # Detached first, so that the pool's invalidation closes nothing.
        record.dbapi_connection = proxy.dbapi_connection = None
        raise exc.DisconnectionError("a connection the coordinator's process opened")
