"""PostgreSQL wake-ups: NOTIFY in the writer's transaction, LISTEN in the coordinator.

NOTIFY is transactional: a notification is queued with the transaction and delivered
only if it commits, after the commit is visible, so a woken coordinator sees the row.
Identical notifications (channel and payload) of one transaction are delivered once.

The listener holds one connection per coordinator, outside the pool, and reads
notifications in a thread of its own. When that connection breaks (a restart, a
network failure) it says so once, reconnects with backoff and, once back, wakes
every worker: what was sent meanwhile is lost, and polling finds it now.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, Engine, Table, func, select

from .cancels import CANCEL_PAYLOAD, cancel_name

log = logging.getLogger("dbworker")

#: Reconnection waits after the listening connection is lost (doubling to the cap).
RECONNECT_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 10.0
#: How often the listener checks that its connection still answers while quiet: a
#: network failure without a reset (no FIN) would otherwise go unnoticed.
PING_SECONDS = 30.0
#: How long the listener's ``notifies()`` waits before checking for a stop.
READ_SECONDS = 0.25
#: The function the opt-in triggers call; the trigger passes the channel.
TRIGGER_FUNCTION = "dbworker_notify"


def notify(conn: Connection, channels: Iterable[str], payload: str = "") -> None:
    """Queue one notification per channel in ``conn``'s transaction (one statement)."""
    chosen = sorted(channels)
    if chosen:
        conn.execute(select(*(func.pg_notify(channel, payload) for channel in chosen)))


class PoolerDetected(Exception):
    """The listening connection goes through a pooler (LISTEN would not stay put)."""


class Listener:
    """One coordinator's listening connection, read in a thread, kept alive."""

    def __init__(
        self,
        engine: Engine,
        channels: Mapping[str, str],
        wake: Callable[[set[str] | None], None],
        ident: str,
    ) -> None:
        #: channel -> worker name
        self.channels = dict(channels)
        self._engine = engine
        self._wake = wake
        #: Notifications carrying this payload are this coordinator's own.
        self.ident = ident
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dbworker-listener", daemon=True)
        #: Whether notifications are being received now (for tests and health).
        self.listening = threading.Event()
        #: Connections made so far (a reconnection adds one).
        self.connections = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=READ_SECONDS * 8 + 5)

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        wait = RECONNECT_SECONDS
        lost_at: float | None = None
        while not self._stopping.is_set():
            try:
                conn = self._connect()
            except PoolerDetected as exc:
                log.warning(
                    "dbworker: notifications disabled: %s; new work is found by polling", exc
                )
                return
            except Exception as exc:
                if lost_at is None:
                    lost_at = time.monotonic()
                    log.warning(
                        "dbworker: cannot listen for notifications (%s: %s); polling until "
                        "the listener reconnects",
                        type(exc).__name__,
                        exc,
                    )
                self._stopping.wait(wait)
                wait = min(wait * 2, RECONNECT_MAX_SECONDS)
                continue
            wait = RECONNECT_SECONDS
            self.connections += 1
            self.listening.set()
            if self.connections > 1 or lost_at is not None:
                # Notifications sent while we were away are gone: look at everything now.
                self._wake(None)
            if lost_at is not None:
                log.warning(
                    "dbworker: listening for notifications again after %.1fs",
                    time.monotonic() - lost_at,
                )
                lost_at = None
            try:
                self._listen(conn)
            except Exception as exc:
                if not self._stopping.is_set():
                    lost_at = time.monotonic()
                    log.warning(
                        "dbworker: the listening connection was lost (%s: %s); polling "
                        "until it reconnects",
                        type(exc).__name__,
                        str(exc).strip(),
                    )
            finally:
                self.listening.clear()
                with contextlib.suppress(Exception):
                    conn.close()

    def _connect(self) -> Any:
        """A psycopg 3 connection outside the engine's pool, listening on every channel."""
        proxy = self._engine.raw_connection()
        try:
            # Detached: closing it closes the connection instead of pooling it, and the
            # pool never hands a LISTENing session to anyone else.
            conn = proxy.driver_connection
            proxy.detach()
            if conn is None or not hasattr(conn, "notifies"):
                raise PoolerDetected(
                    f"the driver {type(conn).__module__} has no notifies(); notifications "
                    "need psycopg 3 (postgresql+psycopg://)"
                )
            conn.rollback()
            conn.autocommit = True
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            if pid != conn.info.backend_pid:
                # A pooler (PgBouncer) answers the start-up with a pid of its own. In its
                # transaction mode LISTEN binds to whichever server connection ran it,
                # and notifications would reach other clients or no one.
                raise PoolerDetected(
                    f"the connection goes through a pooler (backend pid {conn.info.backend_pid} "
                    f"at connect, {pid} running queries; PgBouncer?): pass the Coordinator "
                    "listen_url=, a URL of the server itself, to be woken"
                )
            for channel in sorted(self.channels):
                conn.execute(f'LISTEN "{channel}"')
        except BaseException:
            proxy.close()
            raise
        return conn

    def _listen(self, conn: Any) -> None:
        checked = time.monotonic()
        while not self._stopping.is_set():
            # What arrived together wakes the scheduler once: a commit to a table that
            # several workers watch notifies each worker's channel, and woken for the
            # first alone, the scheduler polled that worker (2 ms) before the others
            # (``stop_after``: all the notifications of the first packet received).
            woken: set[str] = set()
            for note in conn.notifies(timeout=READ_SECONDS, stop_after=1):
                if note.payload == self.ident:
                    continue  # our own announcement: this coordinator already acted on it
                name = self.channels.get(note.channel)
                if name is not None:
                    cancelled = note.payload == CANCEL_PAYLOAD
                    woken.add(cancel_name(name) if cancelled else name)
            if woken:
                self._wake(woken)
            now = time.monotonic()
            if now - checked >= PING_SECONDS:
                conn.execute("SELECT 1")
                checked = now


def trigger_ddl(table: Table, channel: str) -> list[str]:
    """SQL creating the opt-in trigger that notifies ``channel`` for every statement
    that inserts into or updates ``table`` (whoever runs it: raw SQL, other services).

    FOR EACH STATEMENT, not row: one notification per statement, and PostgreSQL folds
    a transaction's identical notifications into one.
    """
    schema = f'"{table.schema}".' if table.schema else ""
    return [
        f"CREATE OR REPLACE FUNCTION {TRIGGER_FUNCTION}() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify(TG_ARGV[0], ''); RETURN NULL; END $$",
        f'DROP TRIGGER IF EXISTS "{channel}_wake" ON {schema}"{table.name}"',
        f'CREATE TRIGGER "{channel}_wake" AFTER INSERT OR UPDATE ON {schema}"{table.name}" '
        f"FOR EACH STATEMENT EXECUTE FUNCTION {TRIGGER_FUNCTION}('{channel}')",
    ]


def drop_trigger_ddl(table: Table, channel: str) -> list[str]:
    """SQL removing the trigger (the shared function stays: other workers may use it)."""
    schema = f'"{table.schema}".' if table.schema else ""
    return [f'DROP TRIGGER IF EXISTS "{channel}_wake" ON {schema}"{table.name}"']
