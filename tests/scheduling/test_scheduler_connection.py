"""The scheduler's kept connection on PostgreSQL (``Dialect.scheduler_connection``): the
claim's plan choices are off for its whole session, so that a claim, and a discovery
before it, is one statement and one round trip, with no BEGIN and no COMMIT around it;
a connection the scheduler lets go has them reset (or is closed, if it cannot be), never
handed on to the pool's other users with those settings; through a transaction pooler
nothing outlives a transaction, and the claim switches them itself as before."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection, make_url, select

from dbworker.dialects import for_url, postgresql
from dbworker.dialects.pooling import POOLED
from dbworker.dialects.postgresql import PLAN_SETTINGS
from dbworker.engines import coordination_engine
from dbworker.scheduling.outbox import Outbox, SchedulerHealth
from dbworker.testing.harness import LEASE, OWNER, Harness, ids
from dbworker.testing.models import Item
from wire import WireTrace

pytestmark = pytest.mark.backends("postgresql")


def _settings(conn: Connection) -> dict[str, str]:
    return {name: conn.exec_driver_sql(f"SHOW {name}").scalar_one() for name in PLAN_SETTINGS}


@pytest.mark.parametrize("ending", ["reset", "dropped", "failing"])
def test_the_scheduler_plans_for_its_session_and_resets_what_it_lets_go(
    database_url: str, ending: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = make_url(database_url)
    dialect = for_url(url)
    engine = coordination_engine(url, dialect, {})
    outbox = Outbox(engine, dialect, SchedulerHealth())
    try:
        with engine.connect() as conn:
            defaults = _settings(conn)
        assert defaults != dict.fromkeys(PLAN_SETTINGS, "off")
        assert outbox.transaction("reading", _settings) == dict.fromkeys(PLAN_SETTINGS, "off")
        if ending == "failing":  # the reset fails, the connection lives: it is closed
            monkeypatch.setattr(postgresql, "_SESSION_RESET", "SELECT dbworker_no_such()")
        if ending == "dropped":  # the server ended it: it cannot be reset, nor used
            pid = outbox.transaction("its pid", lambda c: c.exec_driver_sql(_PID).scalar_one())
            with engine.connect() as other:
                other.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
        outbox.close()
        # Every connection the pool holds now is as the application's would be.
        held = [engine.connect() for _ in range(3)]
        try:
            assert [_settings(conn) for conn in held] == [defaults] * 3
        finally:
            for conn in held:
                conn.close()
    finally:
        outbox.close()
        engine.dispose()


_PID = "SELECT pg_backend_pid()"


def _claim_trips(h: Harness, conn: Connection, discover: bool) -> tuple[list[Any], list[str]]:
    trace = WireTrace()
    trace.follow(conn.connection.dbapi_connection)
    with conn.begin():
        if discover:
            h.dialect.discover_for_claim(conn, h.items)
        claims = h.dialect.claim(conn, h.items, select(Item).order_by(Item.id), 2, LEASE, OWNER)
    return claims, trace.round_trips()


def test_a_claim_on_the_scheduler_connection_is_one_round_trip(database_url: str) -> None:
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed()
        conn = h.scheduler()
        claims, trips = _claim_trips(h, conn, discover=True)
        assert ids(claims) == [1, 2]
        assert trips == ["WITH", "WITH"], trips  # the discovery, the claim
        claims, trips = _claim_trips(h, conn, discover=False)
        assert ids(claims) == [3, 4]
        assert trips == ["WITH"], trips
        assert [(h.record(h.items, i) or {}).get("status") for i in (1, 2, 3, 4)] == ["working"] * 4


def test_through_a_pooler_the_claim_switches_the_settings_itself(database_url: str) -> None:
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed()
        h.discover(h.items)
        conn = h.actor()
        conn.info[POOLED] = True  # as detection marks a pooler's connections
        h.dialect.scheduler_connection(conn)
        assert _settings(conn) != dict.fromkeys(PLAN_SETTINGS, "off")
        conn.rollback()
        claims, trips = _claim_trips(h, conn, discover=False)
        assert ids(claims) == [1, 2]
        assert trips == ["BEGIN", "SELECT", "WITH", "COMMIT"], trips
