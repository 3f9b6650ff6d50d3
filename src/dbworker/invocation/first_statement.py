"""A handler session's connection, taken at its first statement on the event loop.

A handler that sends no statement (its row read apart, an I/O wait, its writes ending
with others') needs no connection: 50 such handlers at once held 50, each opened at
the first wave. ``HandlerSession._dbworker_lend`` asks for one when the session first
needs it, inside SQLAlchemy's greenlet, where the runtime's kept connection (or the
pool's) can be awaited. (Threads: ``connections.ThreadConnections`` opens the thread's
connection at its first use.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.util import await_only


class AsyncLent:
    """One invocation's connection: None until its session's first statement."""

    __slots__ = ("conn", "take")

    def __init__(self, take: Callable[[], Awaitable[AsyncConnection]]) -> None:
        self.take = take
        self.conn: AsyncConnection | None = None

    def __call__(self) -> Connection:
        conn = self.conn = await_only(self.take())
        sync = conn.sync_connection
        assert sync is not None  # taken open
        return sync

    def holding(self) -> bool:
        """Whether it took a connection and holds a transaction on it."""
        return self.conn is not None and self.conn.in_transaction()
