"""The connections a handler process keeps from one invocation to the next.

Checking a connection out of the pool and back in (with the pool's reset) for every
invocation costs a short task a tenth of its time in the handler process. So each
thread that runs invocations keeps its connection checked out while invocations
follow one another, and the handler's session is bound to it. What the pool did at
each checkout still happens: a connection idle for longer than
``liveness.IDLE_SECONDS`` is pinged when its next transaction begins and replaced if
it died (``dialects.liveness``); one left invalidated, closed or in a transaction is
given back to the pool (which rolls it back) and another checked out.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from ..dialects.base import READ_ONLY_OPTION


def pool_options(
    options: dict[str, Any], url: URL, capacity: int, shared: int = 0
) -> dict[str, Any]:
    """``options`` with a connection pool that holds ``capacity`` invocations at once,
    unless the user chose the pool. Each keeps one connection; it may use two more, on
    demand: one to read the source row apart (``Dialect.source_read_apart``, kept by a
    thread), and one to record its failure (with the pool one short, a failing handler's
    record waited for the pool's timeout, 30 s, then was left to the coordinator), or
    its slot's next invocation's while its ending commits. ``shared``: connections the
    process keeps besides (for reads and endings together): with them taken from the
    same room, a process of one slot waited on the pool for good."""
    if "poolclass" in options or "pool" in options or url.database in (None, "", ":memory:"):
        return options
    return {"pool_size": capacity, "max_overflow": 2 * capacity + shared, **options}


@dataclass(slots=True)
class ThreadConnections:
    """One thread's connections: the handler's, and where the dialect reads the source
    row apart (``Dialect.source_read_apart``) one for that read."""

    write: Connection
    read: Connection | None


class HeldConnections:
    """Connections of ``engine`` kept per thread between invocations."""

    def __init__(self, engine: Engine, read_apart: bool) -> None:
        self.engine = engine
        self.read_apart = read_apart
        # With no pool the user asked for a connection per use: nothing is kept.
        self.enabled = not isinstance(engine.pool, NullPool)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._by_id: dict[int, ThreadConnections] = {}

    def take(self) -> ThreadConnections:
        """This thread's connections for the next invocation."""
        held: ThreadConnections | None = getattr(self._local, "held", None)
        if held is not None and not self._usable(held):
            self.drop()
            held = None
        if held is None:
            held = self._check_out()
        return held

    def done(self) -> None:
        """This thread's invocation is over (its session closed)."""
        if not self.enabled:
            self.drop()

    def drop(self) -> None:
        """Give this thread's connections back to the pool (which rolls them back)."""
        held: ThreadConnections | None = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None:
            with self._lock:
                self._by_id.pop(id(held), None)
            _close(held)

    def close_all(self) -> None:
        """Give every thread's connections back (the threads have stopped using them)."""
        with self._lock:
            kept, self._by_id = list(self._by_id.values()), {}
        for held in kept:
            _close(held)
        self._local = threading.local()

    def _check_out(self) -> ThreadConnections:
        write = self.engine.connect()
        read = None
        if self.read_apart:
            try:
                read = self.engine.connect().execution_options(**{READ_ONLY_OPTION: True})
            except BaseException:
                write.close()
                raise
        held = ThreadConnections(write, read)
        self._local.held = held
        with self._lock:
            self._by_id[id(held)] = held
        return held

    @staticmethod
    def _usable(held: ThreadConnections) -> bool:
        # An idle one is pinged when its next transaction begins (``liveness``).
        return not any(
            conn is not None and (conn.closed or conn.invalidated or conn.in_transaction())
            for conn in (held.write, held.read)
        )


def _close(held: ThreadConnections) -> None:
    for conn in (held.write, held.read):
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: the pool has let go of it
                conn.invalidate()
