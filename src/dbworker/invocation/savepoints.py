"""SAVEPOINTs on the driver's cursor, for the handler processes' engine.

A group (``group.py``) gives each item a SAVEPOINT, which SQLAlchemy creates and
releases through its full execution path with a statement compiled anew for each
(every savepoint has a new name): about 150 µs of a handler process's CPU per item
on SQLite, more than the COMMIT a group saves (``benchmarks.group_path``). Here the
engine's SQLAlchemy dialect issues the same three statements on the driver's cursor
(``dialects.driver_cursor``: in SQLAlchemy's transaction, errors raised as
SQLAlchemy's, a lost connection invalidated), unless someone watches statements, who
then gets SQLAlchemy's path and sees them. The names and the SQL are SQLAlchemy's own,
so a handler's own ``begin_nested()`` behaves as before.

A group's item that succeeded does not release its savepoint (``keep_next_savepoint``):
the next item's savepoint nests inside it, the group's COMMIT ends them all, and each
item saves a round trip. A rollback to the newest savepoint still undoes exactly the
item it belongs to. At most ``GROUP_MAX_ITEMS`` nest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine

from ..dialects.driver_cursor import run_plain, watched

_INSTALLED = "_dbworker_driver_savepoints"
#: In a connection's info: the next RELEASE SAVEPOINT is left out.
_KEEP = "dbworker_keep_savepoint"
#: In a connection's info: a SAVEPOINT began (``savepoints_begun``).
_BEGUN = "dbworker_savepoint_begun"
_VERBS = {
    "do_savepoint": "SAVEPOINT",
    "do_rollback_to_savepoint": "ROLLBACK TO SAVEPOINT",
    "do_release_savepoint": "RELEASE SAVEPOINT",
}


def driver_savepoints(engine: Engine) -> None:
    """Make ``engine``'s savepoint statements run on the driver's cursor (once)."""
    dialect = engine.dialect
    if getattr(dialect, _INSTALLED, False):
        return
    quote = dialect.identifier_preparer.quote
    for method, verb in _VERBS.items():
        setattr(dialect, method, _on_cursor(getattr(dialect, method), verb, quote))
    setattr(dialect, _INSTALLED, True)


def _on_cursor(
    default: Callable[[Connection, str], None], verb: str, quote: Callable[[str], str]
) -> Callable[[Connection, str], None]:
    def run(connection: Connection, name: Any) -> None:
        if verb == "RELEASE SAVEPOINT" and connection.info.pop(_KEEP, False):
            return  # the group's COMMIT ends it
        if verb == "SAVEPOINT":
            connection.info[_BEGUN] = True
        if watched(connection):
            default(connection, name)
        else:
            run_plain(connection, f"{verb} {quote(name)}")

    return run


def savepoints_begun(connection: Connection, *, forget: bool = False) -> bool:
    """Whether a SAVEPOINT began on ``connection`` (installed first) since it was last
    asked with ``forget``. (A kept savepoint's ``NestedTransaction`` ends as if released,
    so SQLAlchemy's ``in_nested_transaction()`` does not tell.)"""
    if forget:
        return bool(connection.info.pop(_BEGUN, False))
    return bool(connection.info.get(_BEGUN, False))


def keep_next_savepoint(connection: Connection) -> None:
    """Leave out the next RELEASE SAVEPOINT on ``connection`` (installed first)."""
    connection.info[_KEEP] = True


def forget_kept(connection: Connection) -> None:
    """Whatever happened, no RELEASE is left out later by mistake."""
    connection.info.pop(_KEEP, None)


def commit_kept(connection: Connection, commit: Callable[[], None]) -> None:
    """``commit`` a savepoint on ``connection`` (a session's, or a ``NestedTransaction``'s)
    without releasing it: it commits with its group's transaction, and a later item's
    rollback goes back to that item's own, newer savepoint."""
    keep_next_savepoint(connection)
    try:
        commit()
    finally:
        forget_kept(connection)
