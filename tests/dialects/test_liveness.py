"""Pooled connections are pinged after idling, not on every checkout."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, text

from dbworker.dialects.liveness import ping_when_idle, used_elsewhere
from server_sessions import drop_on_server, server_id

IDLE = 0.05


def _engine(url: str, idle_seconds: float) -> Engine:
    engine = sa.create_engine(url, pool_size=1, max_overflow=0)
    ping_when_idle(engine, idle_seconds)
    return engine


@contextlib.contextmanager
def _pinging(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, list[object]]]:
    """An engine that pings after IDLE, and the connections it pings, in order."""
    engine = _engine(url, IDLE)
    pings: list[object] = []
    original = engine.dialect.do_ping

    def counting(dbapi_connection: Any) -> bool:
        pings.append(dbapi_connection)
        return original(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", counting)
    try:
        yield engine, pings
    finally:
        engine.dispose()


def _use(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


@pytest.mark.backends("postgresql", "mysql")
def test_an_idle_connection_the_server_dropped_is_replaced_before_use(database_url: str) -> None:
    engine = _engine(database_url, IDLE)
    try:
        with engine.connect() as conn:
            first = server_id(conn)
        drop_on_server(database_url, first)
        time.sleep(IDLE * 2)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
            assert server_id(conn) != first
    finally:
        engine.dispose()


@pytest.mark.backends("postgresql", "mysql")
def test_without_the_ping_the_dropped_connection_fails_its_next_user(database_url: str) -> None:
    # The counterpart of the test above: what the ping prevents really happens.
    engine = _engine(database_url, idle_seconds=3600.0)
    try:
        with engine.connect() as conn:
            first = server_id(conn)
        drop_on_server(database_url, first)
        time.sleep(IDLE * 2)
        with pytest.raises(sa.exc.DBAPIError) as raised, engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        assert raised.value.connection_invalidated
    finally:
        engine.dispose()


def test_a_connection_used_a_moment_ago_is_not_pinged(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _pinging(database_url, monkeypatch) as (engine, pings):
        for _ in range(5):
            _use(engine)
        assert pings == []
        time.sleep(IDLE * 2)
        _use(engine)
        assert len(pings) == 1


def test_use_by_another_process_counts_as_recent_use(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A spawn handler process inherits its lent connection's pool as the template
    # last saw it, long idle; a sibling process used it a moment ago.
    with _pinging(database_url, monkeypatch) as (engine, pings):
        _use(engine)
        time.sleep(IDLE * 2)
        used_elsewhere(engine, time.monotonic())
        _use(engine)
        assert pings == []
        # What another process did long ago is no reason to skip the ping.
        time.sleep(IDLE * 2)
        _use(engine)
        assert len(pings) == 1
