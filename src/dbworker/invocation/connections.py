"""The connections a handler process keeps from one invocation to the next.

Checking a connection out of the pool and back in (with the pool's reset) for every
invocation costs a short task a tenth of its time in the handler process. So each
thread that runs invocations keeps its connection checked out while invocations
follow one another, and the handler's session takes it at its first statement
(opening it then, the first time). What the pool did at
each checkout still happens: a connection idle for longer than
``liveness.IDLE_SECONDS`` is pinged when its next transaction begins and replaced if
it died (``dialects.liveness``); one left invalidated, closed or in a transaction is
given back to the pool (which rolls it back) and another checked out.
"""

from __future__ import annotations

import threading
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


class ThreadConnections:
    """One thread's connections, each opened when first used: the handler's
    (``write``), and where the dialect reads the source row apart
    (``Dialect.source_read_apart``) one for that read. A thread whose handlers send no
    statement (their rows read by the process's reading thread, their endings committed
    with others') opens neither: 50 threads of I/O waits do not hold 50 connections."""

    __slots__ = ("_engine", "_read", "_write", "read_apart")

    def __init__(self, engine: Engine, read_apart: bool) -> None:
        self._engine = engine
        self.read_apart = read_apart
        self._write: Connection | None = None
        self._read: Connection | None = None

    @property
    def write(self) -> Connection:
        if self._write is None:
            self._write = self._engine.connect()
        return self._write

    @property
    def read(self) -> Connection:
        assert self.read_apart, "this dialect reads the source row in the handler's transaction"
        if self._read is None:
            self._read = self._engine.connect().execution_options(**{READ_ONLY_OPTION: True})
        return self._read

    def lend(self) -> Connection:
        """``write``, for a handler's session at its first statement
        (``HandlerSession._dbworker_lend``)."""
        return self.write

    def holding(self) -> bool:
        """Whether the handler's connection is open and in a transaction."""
        return self._write is not None and self._write.in_transaction()

    def opened(self) -> list[Connection]:
        return [conn for conn in (self._write, self._read) if conn is not None]


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
        held = ThreadConnections(self.engine, self.read_apart)
        self._local.held = held
        with self._lock:
            self._by_id[id(held)] = held
        return held

    @staticmethod
    def _usable(held: ThreadConnections) -> bool:
        # An idle one is pinged when its next transaction begins (``liveness``).
        return not any(
            conn.closed or conn.invalidated or conn.in_transaction() for conn in held.opened()
        )


def _close(held: ThreadConnections) -> None:
    for conn in held.opened():
        try:
            conn.close()
        except Exception:  # already broken: the pool has let go of it
            conn.invalidate()
