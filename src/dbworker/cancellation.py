"""Cancelling items (``Coordinator.cancel``) in the caller's session and transaction.

The CANCEL row is written through the dialect on the session's connection, so it takes
effect when the caller commits and not at all if the caller rolls back. Whoever holds
the item must then stop its handler: on PostgreSQL a NOTIFY queued in the same
transaction (delivered at commit) wakes every coordinator's listener; on this host the
same-host channel carries the news after the commit; elsewhere the holder finds out at
its next check of what it holds (every ``max_poll_seconds``). Whatever wakes it, the
holder reads the record, so a lost wake-up only costs time.

The holder reports ``EventKind.CANCELLED`` for a run it stops; for an item no one was
running, this coordinator reports it itself, after the commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from .core.event_kinds import EventKind
from .core.names import table_name
from .core.status import Phase
from .dialects import Dialect
from .events import Event, Events
from .scheduling.endings import report
from .wakeups.cancels import CANCEL_PAYLOAD, cancel_name
from .wakeups.local import Sender
from .wakeups.postgresql import notify
from .worker import RegisteredWorkers, Registration

#: session.info key: the cancels of the session's transaction, (worker, source id, run
#: by someone), announced and reported at its commit and forgotten at its rollback.
_CANCELS = "dbworker_cancels"


class Cancellation:
    """One coordinator's cancels."""

    def __init__(
        self,
        dialect: Dialect,
        workers: Mapping[str, Registration],
        sender: Sender,
        events: Events,
    ) -> None:
        self._dialect = dialect
        self._workers = RegisteredWorkers(workers)
        self._sender = sender
        self._events = events

    def cancel(self, session: Session, worker: str, source_id: Any) -> bool:
        """``Coordinator.cancel``: True if the item was open and is now cancelled."""
        registration = self._workers.registration(worker)
        conn = session.connection()
        table = registration.table
        before = self._dialect.read_status(conn, table, source_id)
        if not self._dialect.cancel(conn, table, source_id):
            return False
        if self._dialect.supports_notify:
            # Transactional: delivered at commit, dropped with a rollback.
            notify(conn, [table_name(worker)], CANCEL_PAYLOAD)
        cancels: list[tuple[str, Any, bool]] | None = session.info.get(_CANCELS)
        if cancels is None:
            cancels = session.info[_CANCELS] = []
            event.listen(session, "after_commit", self._committed)
            event.listen(session, "after_rollback", _forget)
        cancels.append((worker, source_id, before is Phase.WORKING))
        return True

    def _committed(self, session: Session) -> None:
        cancels: list[tuple[str, Any, bool]] = session.info.get(_CANCELS) or []
        session.info[_CANCELS] = []
        if cancels and not self._dialect.supports_notify:
            self._sender.send({cancel_name(worker) for worker, _, _ in cancels})
        for worker, source_id, running in cancels:
            if not running:  # a holder reports the runs it stops
                report(self._events, Event(EventKind.CANCELLED, worker, source_id))


def _forget(session: Session) -> None:
    session.info[_CANCELS] = []
