"""Statements that are transactions of their own, on a psycopg connection.

psycopg opens a transaction with a BEGIN of its own, a round trip before the first
statement, and a COMMIT is another. A handler process whose item sends nothing but
the read of its row and its fenced FINISH paid four round trips for two statements
(a group of items the same: BEGIN, the read, the FINISH of all, COMMIT). Each of
those statements is consistent by itself, so on a connection holding no transaction
psycopg can send them with neither (its autocommit mode, switched on around them and
off again: an attribute of the client, no round trip). SQLAlchemy's transaction on
the ``Connection`` is left as it is: its COMMIT then finds the driver connection idle
and sends nothing.

Only at READ COMMITTED, PostgreSQL's default, where every statement takes its own
snapshot anyway: at REPEATABLE READ or SERIALIZABLE a row read apart would not be
part of the snapshot (nor, for SERIALIZABLE, of the conflicts) the handler's
transaction sees.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection

#: libpq's PQTRANS_IDLE: connected, no transaction open.
_IDLE = 0
_READ_COMMITTED = "READ COMMITTED"


@contextlib.contextmanager
def psycopg_autocommitting(conn: Connection) -> Iterator[bool]:
    """Within it, each statement on ``conn``'s psycopg connection commits by itself
    (yields True) when that connection holds no transaction, is not in autocommit
    already and reads at READ COMMITTED; otherwise statements run as usual (False)."""
    driver: Any = conn.connection.dbapi_connection
    if driver is None or not _may_autocommit(driver, conn):
        yield False
        return
    driver.autocommit = True
    try:
        yield True
    finally:
        # A connection closed meanwhile (invalidated) is never used again.
        if not driver.closed:
            driver.autocommit = False


def _may_autocommit(driver: Any, conn: Connection) -> bool:
    pgconn = getattr(driver, "pgconn", None)  # psycopg 3 (psycopg2 has none)
    if pgconn is None or driver.closed or driver.autocommit:
        return False
    if pgconn.transaction_status != _IDLE:
        return False
    level = driver.isolation_level  # None: the server's default, read at first connect
    if level is None:
        return str(conn.dialect.default_isolation_level) == _READ_COMMITTED
    return str(level.name).replace("_", " ") == _READ_COMMITTED
