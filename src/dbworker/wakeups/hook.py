"""Announce the application's commits that concern registered workers (ORM events).

Listens on the application's session factory. After each flush it notes which
workers the flushed inserts and updates concern (by the tables of their ``eligible``
queries); on PostgreSQL it queues a NOTIFY in that same transaction at once (once per
transaction and channel), so the notification goes out with the commit or not at
all; elsewhere it sends a local wake-up after the commit, and nothing after a
rollback. It never raises into the application's transaction: a wake-up that cannot
be sent leaves the work to polling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction, object_mapper

from ..core.errors import ConfigurationError
from ..core.names import TABLE_PREFIX
from ..dialects import dialect_class
from .local import Sender
from .postgresql import notify

log = logging.getLogger("dbworker")

#: session.info keys: channels notified in the current transaction (PostgreSQL), and
#: channels to announce on the local channel after the commit.
_NOTIFIED = "dbworker_notified"
_PENDING = "dbworker_wake_pending"


class SessionHook:
    """The ORM events of one coordinator on its application's session factory."""

    def __init__(
        self,
        session_factory: Any,
        targets: Callable[[], dict[Table, frozenset[str]]],
        local: Sender | None,
    ) -> None:
        #: The channels each table's writes wake (rebuilt by the coordinator as
        #: workers register).
        self._targets = targets
        self._local = local
        self.installed = _install(session_factory, self)

    # -- events ------------------------------------------------------------------------

    def after_flush(self, session: Session, _flush: UOWTransaction) -> None:
        targets = self._targets()
        if not targets:
            return
        channels: set[str] = set()
        binds: dict[str, Any] = {}
        for instance in (*session.new, *session.dirty):
            try:
                mapper = object_mapper(instance)
            except Exception:
                continue
            for table in mapper.tables:
                found = targets.get(table) if isinstance(table, Table) else None
                if found:
                    channels |= found
                    for channel in found:
                        binds.setdefault(channel, mapper)
        if channels:
            self._noted(session, channels, binds)

    def do_orm_execute(self, state: ORMExecuteState) -> None:
        # Bulk INSERT/UPDATE statements through the session bypass the flush.
        if not (state.is_insert or state.is_update):
            return
        table = getattr(state.statement, "table", None)
        found = self._targets().get(table) if isinstance(table, Table) else None
        if found:
            mapper = state.bind_mapper
            self._noted(state.session, set(found), dict.fromkeys(found, mapper))

    def _noted(self, session: Session, channels: set[str], binds: dict[str, Any]) -> None:
        info = session.info
        pending: set[str] = info.setdefault(_PENDING, set())
        pending |= channels
        notified: set[str] = info.setdefault(_NOTIFIED, set())
        fresh = channels - notified
        if not fresh:
            return
        try:
            by_connection: dict[Any, set[str]] = {}
            for channel in fresh:
                mapper = binds.get(channel)
                arguments = {"mapper": mapper} if mapper is not None else None
                conn = session.connection(bind_arguments=arguments)
                if _can_notify(conn):
                    by_connection.setdefault(conn, set()).add(channel)
            for conn, chosen in by_connection.items():
                notify(conn, chosen)
                notified |= chosen
        except Exception as exc:
            log.debug("dbworker: could not queue a notification: %s", exc)

    def after_commit(self, session: Session) -> None:
        info = session.info
        pending: set[str] | None = info.pop(_PENDING, None)
        notified: set[str] = info.pop(_NOTIFIED, set())
        if pending and self._local is not None:
            # What PostgreSQL delivers needs no local message; the rest (SQLite,
            # MariaDB) goes to the coordinators on this host, by worker name.
            rest = pending - notified
            if rest:
                self._local.send(_names(rest))

    def after_rollback(self, session: Session) -> None:
        # The writes are gone, and PostgreSQL dropped the notifications with them.
        session.info.pop(_PENDING, None)
        session.info.pop(_NOTIFIED, None)

    def after_soft_rollback(self, session: Session, _previous: Any) -> None:
        # A savepoint's rollback drops the notifications queued inside it: queue them
        # again at the next flush (PostgreSQL folds duplicates into one).
        session.info.pop(_NOTIFIED, None)


def _names(channels: Iterable[str]) -> set[str]:
    return {channel.removeprefix(TABLE_PREFIX) for channel in channels}


def _install(session_factory: Any, hook: SessionHook) -> bool:
    """Listen on ``session_factory``'s events. The factory holds the hook (and so the
    coordinator's registrations) for as long as it lives: an application that builds a
    Coordinator only to register its workers, and drops it, must still announce."""

    def relay(name: str) -> Callable[..., None]:
        return getattr(hook, name)  # type: ignore[no-any-return]

    names = (
        "after_flush",
        "do_orm_execute",
        "after_commit",
        "after_rollback",
        "after_soft_rollback",
    )
    try:
        event.listen(session_factory, names[0], relay(names[0]))
    except Exception:
        return False
    for name in names[1:]:
        event.listen(session_factory, name, relay(name))
    return True


def _can_notify(conn: Any) -> bool:
    """Whether ``conn``'s database takes NOTIFY (a session may bind several)."""
    try:
        return dialect_class(conn.dialect.name).supports_notify
    except ConfigurationError:  # a database dbworker has no dialect for
        return False
