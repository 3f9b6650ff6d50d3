"""PostgreSQL through PgBouncer in transaction mode: what the pooler breaks, and that
dbworker's own engines and wake-ups do without it. (The conformance kit and the crash
suite run through it too: their "postgresql-pgbouncer" parameters.)"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

from crash import app
from crash.support import add_items, effects, make_coordinator, unfinished_states
from dbworker import ConfigurationError, Coordinator
from dbworker.dialects import for_url
from dbworker.dialects.pooling import is_pooled
from topologies.pgbouncer import DIRECT, PgBouncer
from waiting import wait_until

pytestmark = [pytest.mark.topology, pytest.mark.backends("postgresql")]


def _libpq(url: str) -> str:
    parsed = make_url(url)
    return f"host={parsed.host} port={parsed.port} dbname={parsed.database} user={parsed.username}"


def test_the_pooler_shares_server_connections_between_clients(
    pgbouncer: PgBouncer, database_url: str
) -> None:
    """The premise: two clients' prepared statements meet on one server connection."""
    routed = _libpq(pgbouncer.route(database_url, plugin=False))
    with (
        psycopg.connect(routed, autocommit=True) as one,
        psycopg.connect(routed, autocommit=True) as two,
        pytest.raises(psycopg.errors.DuplicatePreparedStatement),
    ):
        for i in range(10):
            for conn in (one, two):
                conn.execute("SELECT 1 + %s", (i,)).fetchall()


def test_dbworker_engines_detect_the_pooler(pgbouncer: PgBouncer, database_url: str) -> None:
    dialect = for_url(database_url)
    for url, pooled in ((pgbouncer.route(database_url, plugin=False), True), (database_url, False)):
        engine = create_engine(url)
        dialect.configure_engine(engine)
        try:
            with engine.connect() as conn:
                assert is_pooled(conn) is pooled
                threshold = conn.connection.dbapi_connection.prepare_threshold  # type: ignore[union-attr]
                assert (threshold is None) is pooled
                for i in range(10):  # no prepared statement: nothing to collide
                    conn.execute(text("SELECT 1 + :i"), {"i": i}).all()
        finally:
            engine.dispose()


def test_the_url_plugin_marks_any_engine_pooled(pgbouncer: PgBouncer, database_url: str) -> None:
    engine = create_engine(pgbouncer.route(database_url))
    try:
        with engine.connect() as conn:
            assert is_pooled(conn)
            assert conn.connection.dbapi_connection.prepare_threshold is None  # type: ignore[union-attr]
    finally:
        engine.dispose()


def test_two_services_through_the_pooler_finish_every_item_once(
    pgbouncer: PgBouncer, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator's report: two coordinators through PgBouncer, many items. Their own
    engines find the pooler themselves (no plugin on their URL); without listen_url
    each says once that it polls."""
    routed = pgbouncer.route(database_url, plugin=False)
    DIRECT.pop(routed)  # so that make_coordinator passes no listen_url
    engine = create_engine(pgbouncer.route(database_url))  # the application's: documented
    items = 120
    made = []
    try:
        with caplog.at_level(logging.WARNING, logger="dbworker"):
            for _ in range(2):
                made.append(make_coordinator(engine, routed, lease_seconds=10, concurrency=2))
            workdir = tmp_path / "work"
            workdir.mkdir()
            ids = add_items(engine, workdir, [app.QUICK] * items)
            for coordinator in made:
                coordinator.start()
            wait_until(
                lambda: len(effects(engine)) >= items,
                "every item to finish",
                timeout=120,
                diagnose=lambda: str(unfinished_states(made[0], engine, ids)),
            )
            time.sleep(0.5)  # a duplicate would show up now
        assert sorted(i for i, _, _ in effects(engine)) == ids, "each item exactly once"
        assert unfinished_states(made[0], engine, ids) == {}
        assert all(c.running for c in made), "services alive"
        warnings = [r for r in caplog.records if "listen_url" in r.getMessage()]
        assert len(warnings) == 2, [r.getMessage() for r in warnings]  # one per coordinator
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        for coordinator in made:
            coordinator.stop(timeout=0)
        engine.dispose()


def test_listen_url_wakes_a_coordinator_behind_the_pooler(
    pgbouncer: PgBouncer, database_url: str, tmp_path: Path
) -> None:
    engine = create_engine(pgbouncer.route(database_url))
    # make_coordinator passes listen_url=, the server itself, for a routed URL.
    coordinator = make_coordinator(
        engine, pgbouncer.route(database_url), lease_seconds=10, concurrency=1
    )
    assert coordinator._wake_wiring.listen_url == make_url(database_url)
    try:
        coordinator.start()
        scheduler = coordinator._scheduler
        assert scheduler is not None and scheduler.wakeups is not None
        wait_until(scheduler.wakeups.ready, "the listener on the server itself")
    finally:
        coordinator.stop(timeout=0)
        engine.dispose()


def test_listen_url_must_name_the_same_database(pgbouncer: PgBouncer, database_url: str) -> None:
    engine = create_engine(pgbouncer.route(database_url))
    try:
        with pytest.raises(ConfigurationError, match="listen_url must name the database"):
            Coordinator(
                sessionmaker(engine),
                database_url=pgbouncer.route(database_url),
                listen_url=make_url(database_url).set(database="elsewhere"),
            )
    finally:
        engine.dispose()
