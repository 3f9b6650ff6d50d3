"""A PostgreSQL failover mid-run: the primary killed, its asynchronous replica promoted.

A handler's writes and its record commit in one transaction, so the failover keeps both
or loses both: an item whose commit had not reached the replica runs again on the new
primary, and none runs twice."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from crash import app
from crash.support import add_items, effects, make_coordinator, unfinished_states
from topologies.failover import Failover
from waiting import wait_until

pytestmark = pytest.mark.topology

ITEMS = 80


def _done(engine: object, count: int) -> bool:
    try:
        return len(effects(engine)) >= count  # type: ignore[arg-type]
    except Exception:  # the database is failing over
        return False


def test_a_promoted_replica_finishes_every_item_exactly_once(
    failover: Failover, tmp_path: Path
) -> None:
    engine = create_engine(failover.url, pool_pre_ping=True)
    workdir = tmp_path / "work"
    workdir.mkdir()
    made = [make_coordinator(engine, failover.url, lease_seconds=3, concurrency=2)]
    made.append(make_coordinator(engine, failover.url, lease_seconds=3, concurrency=2))
    ids = add_items(engine, workdir, [app.SLEEP] * ITEMS, sleep_seconds=0.1)
    try:
        for coordinator in made:
            coordinator.start()
        wait_until(lambda: _done(engine, ITEMS // 4), "a quarter of the items to finish")
        failover.primary.kill()
        time.sleep(1)  # the services meet a dead primary
        failover.replica.promote()
        wait_until(
            lambda: _done(engine, ITEMS),
            "every item to finish on the promoted replica",
            timeout=120,
            diagnose=lambda: str(unfinished_states(made[0], engine, ids)),
        )
        time.sleep(1)  # a second run would commit now
        done = sorted(item for item, _, _ in effects(engine))
        assert done == ids, "each item's effect exactly once on the new primary"
        assert unfinished_states(made[0], engine, ids) == {}
        assert all(coordinator.running for coordinator in made), "services alive"
    finally:
        for coordinator in made:
            coordinator.stop(timeout=0)
        engine.dispose()
