"""SQLite: how dbworker's connections wait for their turn at the write lock.

A handler process's connections wait for as long as the turn is taken (the kernel
wakes them when it is given back); the coordinator's give up after the busy timeout,
as SQLite's own busy handler would; and a thread never waits for a turn it holds
itself on another connection.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

from dbworker.dialects import for_url

#: SQLite's busy timeout and the turns' deadline, for these tests (seconds).
TIMEOUT = 0.1
#: How long the holder keeps the write lock: several times TIMEOUT.
HOLD = 1.0
#: Longer than any of these tests should take; only a hang reaches it.
HANG = 60.0

pytestmark = pytest.mark.backends("sqlite")


def _engine(url: str, *, handlers: bool, connect_args: bool = False) -> Engine:
    """``url``'s engine, configured as dbworker's, its busy timeout TIMEOUT: in the URL,
    or (``connect_args``) in the driver's connect arguments."""
    if connect_args:
        engine = create_engine(url, connect_args={"timeout": TIMEOUT})
    else:
        url = f"{url}?timeout={TIMEOUT}"
        engine = create_engine(url)
    for_url(url).configure_engine(engine, handlers=handlers)
    return engine


def _write_while_another_holds_the_turn(
    url: str, *, handlers: bool, connect_args: bool = False
) -> BaseException | None:
    """Hold the write lock for HOLD seconds on one engine while another (a handler
    process's, or the coordinator's) writes; what that write raised, if anything."""
    holder = _engine(url, handlers=False)
    waiter = _engine(url, handlers=handlers, connect_args=connect_args)
    with holder.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            with waiter.begin() as conn:
                conn.execute(text("INSERT INTO t VALUES (2)"))
            outcome.append(None)
        except BaseException as exc:  # reported to the test below
            outcome.append(exc)

    try:
        with holder.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (1)"))
            thread = threading.Thread(target=write)
            thread.start()
            time.sleep(HOLD)
        thread.join(HANG)
        assert not thread.is_alive(), "the write never ended"
        return outcome[0]
    finally:
        holder.dispose()
        waiter.dispose()


def test_a_handler_connection_waits_for_its_turn_past_the_busy_timeout(database_url: str) -> None:
    assert _write_while_another_holds_the_turn(database_url, handlers=True) is None


@pytest.mark.parametrize("where", ["url", "connect_args"])
def test_a_coordinator_connection_gives_up_after_the_busy_timeout(
    database_url: str, where: str
) -> None:
    # The test above can fail: the same write, impatient, meets a locked database. The
    # busy timeout bounds the wait for a turn wherever it was given (with connect_args
    # the turn waited for the default 30 s, past the holder's commit, and then wrote).
    error = _write_while_another_holds_the_turn(
        database_url, handlers=False, connect_args=where == "connect_args"
    )
    assert isinstance(error, OperationalError) and "locked" in str(error)


def test_a_thread_does_not_wait_for_a_turn_it_holds(database_url: str) -> None:
    engine = _engine(database_url, handlers=True)
    outcome: list[Any] = []

    def write_twice() -> None:
        with engine.begin() as first:
            first.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
            try:
                with engine.begin() as second:  # the same thread, another connection
                    second.execute(text("INSERT INTO t VALUES (1)"))
                outcome.append(None)
            except OperationalError as exc:
                outcome.append(exc)

    try:
        thread = threading.Thread(target=write_twice)
        thread.start()
        thread.join(HANG)
        assert not thread.is_alive(), "the thread waited for itself"
    finally:
        engine.dispose()
    assert isinstance(outcome[0], OperationalError) and "locked" in str(outcome[0])
