"""The wake-ups of a running coordinator: its listener, its local socket, and the
announcements it makes when a worker others depend on completes an item."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import Connection

from .local import Receiver, Sender
from .postgresql import Listener, notify
from .targets import Watched, dependents

log = logging.getLogger("dbworker")

Wake = Callable[[set[str] | None], None]


class Wakeups:
    """Started with the scheduler, stopped after it.

    ``notify`` is whether this database takes NOTIFY (PostgreSQL); ``identity`` names
    the database for the local channel, used where it does not.
    """

    def __init__(
        self,
        engine: Any,
        workers: Iterable[Watched],
        *,
        notify: bool,
        identity: str,
        sender: Sender | None,
    ) -> None:
        self.workers = list(workers)
        self._engine = engine
        self._notify = notify
        self._identity = identity
        self._sender = sender
        self.ident = f"{os.getpid()}-{secrets.token_hex(6)}"
        self.dependents: Mapping[str, frozenset[str]] = dependents(self.workers)
        self.listener: Listener | None = None
        self.receiver: Receiver | None = None

    def start(self, wake: Wake, received: Wake) -> None:
        """Start listening. ``wake`` is called from the listener's thread (PostgreSQL);
        ``received`` from the loop that waits on ``wait_handles()`` and calls
        ``receive()`` (the local channel)."""
        if self._notify:
            channels = {w.channel: w.name for w in self.workers}
            self.listener = Listener(self._engine, channels, wake, self.ident)
            self.listener.start()
        else:
            self.receiver = Receiver(self._identity, received)
            self.receiver.start()

    def wait_handles(self) -> list[int]:
        """Descriptors readable when wake-ups wait for ``receive()``."""
        fd = None if self.receiver is None else self.receiver.fileno()
        return [] if fd is None else [fd]

    def receive(self) -> None:
        """The wake-ups waiting on ``wait_handles()``, passed to ``received``."""
        if self.receiver is not None:
            self.receiver.receive()

    def ready(self) -> bool:
        """Whether wake-ups are being received now (a listener connected, a socket bound)."""
        if self.listener is not None:
            return self.listener.listening.is_set()
        return self.receiver is not None and self.receiver.path is not None

    def stop(self) -> None:
        if self.listener is not None:
            self.listener.stop()
        if self.receiver is not None:
            self.receiver.stop()

    def to_announce(self, completed: Iterable[str]) -> set[str]:
        """The workers to wake because ``completed`` workers finished items."""
        woken: set[str] = set()
        for name in completed:
            woken |= self.dependents.get(name, frozenset())
        return woken

    def announce(
        self, names: set[str], transaction: Callable[[str, Callable[[Connection], Any]], Any]
    ) -> None:
        """Tell other coordinators that ``names`` may have work (this one knows)."""
        if not names:
            return
        if self._notify:
            channels = {w.channel for w in self.workers if w.name in names}
            transaction(
                "announcing completed items",
                lambda conn: notify(conn, channels, self.ident),
            )
        elif self._sender is not None:
            # Not to this coordinator's own socket: it has polled those workers already.
            own = self.receiver.path if self.receiver is not None else None
            self._sender.send(names, exclude=own)
