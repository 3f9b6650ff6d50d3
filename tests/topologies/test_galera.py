"""MariaDB Galera: three nodes, a coordinator on each, a node killed and restarted mid-run.

``SKIP LOCKED`` and ``FOR UPDATE`` lock on one node only: coordinators on two nodes can
claim the same record at once. The claims conflict at COMMIT (certification: error 1213),
one wins, the other is contention, retried; a stale holder's finish is fenced by its
token. So each item's effect commits exactly once."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from crash import app
from crash.support import add_items, effects, make_coordinator, unfinished_states
from dbworker.dialects import for_url
from dbworker.events import Event, EventKind, Events
from dbworker.scheduling.outbox import Deferred, Outbox, SchedulerHealth
from topologies.galera import Galera
from waiting import wait_until

pytestmark = pytest.mark.topology

ITEMS = 150


def _reader(url: str) -> Engine:
    # Reads after writes made on other nodes: wait until this node has applied them.
    return create_engine(url, connect_args={"init_command": "SET SESSION wsrep_sync_wait = 1"})


def _finished(engine: Engine, count: int) -> bool:
    try:
        return len(effects(engine)) >= count
    except Exception:
        return False


def _certification_conflict_is_contention(galera: Galera, caplog: pytest.LogCaptureFixture) -> None:
    one, two = (create_engine(node.url(galera.database)) for node in galera.nodes[:2])
    try:
        with one.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS contended")
            conn.exec_driver_sql("CREATE TABLE contended (id INT PRIMARY KEY, n INT)")
            conn.exec_driver_sql("INSERT INTO contended VALUES (1, 0)")
        wait_until(lambda: _rows(two) == 1, "the row on the second node")
        events = Events()
        seen: list[Event] = []
        events.subscribe(seen.append)
        health = SchedulerHealth()
        outbox = Outbox(two, for_url(galera.nodes[1].url(galera.database)), health, events)

        def conflicting(conn: object) -> None:
            conn.exec_driver_sql("UPDATE contended SET n = n + 1 WHERE id = 1")  # type: ignore[attr-defined]
            # Another node commits a write to the same row first: this one's write set
            # fails certification when it commits.
            with one.begin() as other:
                other.exec_driver_sql("UPDATE contended SET n = n + 10 WHERE id = 1")

        with caplog.at_level(logging.DEBUG, logger="dbworker"), pytest.raises(Deferred):
            outbox.transaction("claiming for worker=w", conflicting, {"worker": "w"})
        assert health.contention == 1 and health.database_ok
        assert [e.kind for e in seen] == [EventKind.CONTENTION]
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    finally:
        one.dispose()
        two.dispose()


def _rows(engine: Engine) -> int:
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM contended")).scalar_one())
    except Exception:
        return 0


def _service_per_node_and_a_node_killed(
    galera: Galera, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    urls = [node.url(galera.database) for node in galera.nodes]
    reader = _reader(urls[0])
    engines = [create_engine(url, pool_pre_ping=True) for url in urls]
    workdir = tmp_path / "work"
    workdir.mkdir()
    with reader.begin() as conn:
        for table in ("crash_effects", "crash_items", "dbworker_crash", "dbworker_coordinators"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    made = [
        make_coordinator(engine, url, lease_seconds=3, concurrency=2)
        for engine, url in zip(engines, urls, strict=True)
    ]
    ids = add_items(engines[0], workdir, [app.SLEEP] * ITEMS, sleep_seconds=0.02)
    victim = galera.nodes[2]
    try:
        with caplog.at_level(logging.INFO, logger="dbworker"):
            for coordinator in made:
                coordinator.start()
                # A group's COMMIT lost to certification would re-run the whole group.
                assert not coordinator._dialect.group_commit, "no groups on a Galera node"
            wait_until(lambda: _finished(reader, ITEMS // 4), "a quarter of the items")
            victim.kill()
            restarted = threading.Thread(target=galera.restart, args=(victim,))
            restarted.start()
            wait_until(
                lambda: _finished(reader, ITEMS),
                "every item to finish",
                timeout=180,
                diagnose=lambda: str(unfinished_states(made[0], reader, ids)),
            )
            restarted.join(180)
            wait_until(lambda: galera.size() == 3, "the killed node back in the cluster")
            time.sleep(1)  # a second run would commit now
        done = sorted(item for item, _, _ in effects(reader))
        assert done == ids, "each item's effect exactly once"
        assert unfinished_states(made[0], reader, ids) == {}
        assert all(coordinator.running for coordinator in made), "services alive"
        # The driver's error as MySQLdb renders it: "(1213, 'Deadlock found ...')". A bare
        # "1213" also matched a retry delay of 1.0613121... in a logged statement.
        deadlocks = [r for r in caplog.records if "(1213," in r.getMessage() or (
            r.exc_info is not None and "(1213," in str(r.exc_info[1]))]  # fmt: skip
        assert deadlocks == [], "certification conflicts are contention, not errors"
        contention = sum(c._scheduler.health.contention for c in made if c._scheduler)
        print(f"contention retried: {contention}")
    finally:
        for coordinator in made:
            coordinator.stop(timeout=0)
        for engine in (*engines, reader):
            engine.dispose()


def _execution_tables_suit_galera(galera: Galera) -> None:
    """Galera replicates only InnoDB tables with primary keys, row-based."""
    engine = create_engine(galera.nodes[0].url(galera.database))
    try:
        with engine.connect() as conn:
            missing = conn.execute(
                text(
                    "SELECT t.table_name FROM information_schema.tables t WHERE "
                    "t.table_schema = DATABASE() AND t.table_name LIKE 'dbworker%' AND NOT "
                    "EXISTS (SELECT 1 FROM information_schema.table_constraints c WHERE "
                    "c.table_schema = t.table_schema AND c.table_name = t.table_name AND "
                    "c.constraint_type = 'PRIMARY KEY')"
                )
            ).all()
            assert missing == []
            fmt = conn.execute(text("SELECT @@binlog_format, @@innodb_autoinc_lock_mode")).one()
            assert tuple(fmt) == ("ROW", 2)
    finally:
        engine.dispose()


def test_galera(galera: Galera, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One test, so that one pytest process builds the cluster (xdist would otherwise
    build one per worker that gets a Galera test)."""
    _certification_conflict_is_contention(galera, caplog)
    caplog.clear()
    _service_per_node_and_a_node_killed(galera, tmp_path, caplog)
    _execution_tables_suit_galera(galera)
