"""Connections a spawn-per-task template opens and lends to its handler processes."""

from __future__ import annotations

import time

from sqlalchemy import Engine

from .runtime import Runtime


class LentConnections:
    """Connections the template opens and lends, each to one handler process at a time.

    Where the dialect allows it (``sessions_outlive_processes``), a handler process
    does not connect: it inherits a connection the template opened and left idle,
    and on its way out resets the session and leaves the connection open. The
    template lends it again once that process has exited cleanly; after any other
    exit (a crash, a kill, a failed reset) it closes the connection, which ends the
    session and rolls back whatever the process left open. Saves each invocation a
    connection, and on PostgreSQL a server backend process with cold caches.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.enabled = runtime.dialect.sessions_outlive_processes
        self.free: list[Engine] = []
        self.lent: dict[int, Engine] = {}
        #: When each free engine's connection was last in use (by the process that had it).
        self.used_at: dict[Engine, float] = {}

    def lend(self, limit: int) -> tuple[Engine | None, bool]:
        """A connected engine for the next process (None: it connects itself), and
        whether it was opened just now."""
        if not self.enabled:
            return None, False
        if self.free:
            return self.free.pop(), False
        if len(self.lent) >= limit:
            return None, False
        try:
            engine = self.runtime.new_engine()
            with engine.connect():
                pass
            self.runtime.rehearse_all(engine)
        except Exception:  # the process connects itself, and meets the error there
            return None, False
        return engine, True

    def lent_to(self, pid: int, engine: Engine | None) -> None:
        if engine is not None:
            self.lent[pid] = engine

    def returned(self, pid: int, exitcode: int) -> None:
        engine = self.lent.pop(pid, None)
        if engine is None:
            return
        if exitcode == 0:
            self.free.append(engine)
            # Reset (so alive) as that process exited: the next needs no ping first.
            self.used_at[engine] = time.monotonic()
        else:
            self.used_at.pop(engine, None)
            engine.dispose()

    def returned_at(self, engine: Engine | None) -> float | None:
        return None if engine is None else self.used_at.get(engine)

    def learned(self) -> None:
        for engine in self.free:
            self.runtime.rehearse_all(engine)
