"""Taking turns at SQLite's write lock, between dbworker's own connections.

SQLite has one writer at a time. A connection that finds the write lock taken
waits in SQLite's busy handler, which sleeps 1 ms, then 2, 5, 10 ms... before it
looks again, however soon the lock came free: with a coordinator and a few handler
processes each writing for a fraction of a millisecond, most of the time goes to
sleeping. So dbworker's connections first queue on an OS file lock beside the
database (waking the moment it is released), and take SQLite's write lock when
they have their turn. SQLite's own lock still does the excluding: the turns only
decide who asks next, and a turn not given back in time (a bug, or a transaction
left open) costs a wait of at most the busy timeout, never correctness.

A connection that must not wait for long (the coordinator's: it renews leases and
kills handlers past their timeout, which may be what holds the turn) looks again
after short pauses until the busy timeout. A handler process's connections may wait
without pausing (``patient``): the kernel wakes them the moment the turn is given
back, and the coordinator bounds their wait as it bounds their handler's run. A
thread that already holds a turn of the same database on another connection never
waits that way: it would wait for itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, event

from .terms import READ_ONLY_OPTION

#: The file lock's name: the database's path with this suffix (beside -wal and -shm).
SUFFIX = "-dbworker-turns"
_FD = "dbworker_turn_fd"
#: How a connection takes its turn: (turns file, timeout, patient), as ``take_turns``.
_TURNS = "dbworker_turns"
#: The turns file of the turn a connection holds (False: none).
_HELD = "dbworker_turn_held"
#: The holding thread's count of turns held (``_held_here()``), to give one back.
_THREAD = "dbworker_turn_thread"
#: Where a connection's record keeps its busy timeout (seconds), which bounds its wait
#: for a turn too; set when it connects (``sqlite.py``).
BUSY_TIMEOUT_INFO = "dbworker_busy_timeout"
#: First and longest pause between two looks at a taken turn (seconds).
FIRST_PAUSE = 0.00002
LONGEST_PAUSE = 0.001
#: Per thread: how many turns it holds, per database path.
_mine = threading.local()


def take_turns(engine: Engine, database: str, timeout: float, patient: bool = False) -> None:
    """Make ``engine``'s transactions queue for the write lock of ``database`` (a path);
    ``patient``: they may wait for their turn without a deadline (see above); else for
    the connection's busy timeout (``BUSY_TIMEOUT_INFO``), or ``timeout`` seconds."""
    path = database + SUFFIX

    @event.listens_for(engine, "connect")
    def _connect(_dbapi_connection: Any, record: Any) -> None:
        record.info[_FD] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        record.info[_HELD] = False
        record.info[_TURNS] = (path, timeout, patient)

    @event.listens_for(engine, "close")
    def _close(_dbapi_connection: Any, record: Any) -> None:
        _give_back(record.info)
        fd = record.info.pop(_FD, None)
        if fd is not None:
            os.close(fd)  # gives the turn back too

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        # A read transaction needs no turn (WAL readers do not wait for the writer).
        if not connection.invalidated and not connection.get_execution_options().get(
            READ_ONLY_OPTION
        ):
            info = connection.connection.info
            _take(info, path, info.get(BUSY_TIMEOUT_INFO, timeout), patient)

    @event.listens_for(engine, "commit")
    def _commit(connection: Any) -> None:
        if connection.invalidated:
            return  # its connection is gone, and its turn with it (see _invalidate)
        # This event comes before the commit: commit here, so the turn is given back
        # after it (SQLAlchemy's own commit that follows finds nothing to commit). A
        # failure is left to that commit, which reports it; the turn stays until the
        # rollback that follows.
        info = connection.connection.info
        try:
            connection.connection.dbapi_connection.commit()
        except Exception:
            return
        _give_back(info)

    @event.listens_for(engine, "rollback")
    def _rollback(connection: Any) -> None:
        if connection.invalidated:
            return
        info = connection.connection.info
        with contextlib.suppress(Exception):
            connection.connection.dbapi_connection.rollback()
        _give_back(info)

    @event.listens_for(engine, "reset")
    def _reset(dbapi_connection: Any, record: Any, _state: Any = None) -> None:
        # Checked in with a transaction still open: roll it back, then give the turn back.
        with contextlib.suppress(Exception):
            dbapi_connection.rollback()
        _give_back(record.info)

    @event.listens_for(engine, "invalidate")
    def _invalidate(_dbapi_connection: Any, record: Any, _exception: Any) -> None:
        _give_back(record.info)


@contextlib.contextmanager
def turn_for_one_statement(connection: Any) -> Iterator[None]:
    """The write turn of ``connection`` (a SQLAlchemy connection in no transaction) for
    statements that SQLite commits one by one (autocommit, no BEGIN): taken as a
    transaction's begin would take it, given back after. Nothing on an engine without
    turns."""
    info = connection.connection.info
    turns = info.get(_TURNS)
    if turns is None or info.get(_HELD):
        yield
        return
    path, timeout, patient = turns
    _take(info, path, info.get(BUSY_TIMEOUT_INFO, timeout), patient)
    try:
        yield
    finally:
        _give_back(info)


def _held_here() -> Counter[str]:
    held: Counter[str] | None = getattr(_mine, "held", None)
    if held is None:
        held = _mine.held = Counter()
    return held


def _take(info: dict[str, Any], path: str, timeout: float, patient: bool) -> None:
    fd = info.get(_FD)
    if fd is None or info.get(_HELD):
        return
    held_here = _held_here()
    if patient and not held_here[path]:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
            _taken(info, path, held_here)
        return
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return  # SQLite's busy handler decides from here
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
            continue
        _taken(info, path, held_here)
        return


def _taken(info: dict[str, Any], path: str, held_here: Counter[str]) -> None:
    info[_HELD] = path
    info[_THREAD] = held_here
    held_here[path] += 1


def _give_back(info: dict[str, Any]) -> None:
    fd = info.get(_FD)
    path = info.get(_HELD)
    if fd is None or not path:
        return
    info[_HELD] = False
    held_here = info.pop(_THREAD, None)
    if held_here is not None and held_here[path] > 0:
        held_here[path] -= 1
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
