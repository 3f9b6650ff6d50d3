"""The coordinator registry across a SIGKILLed coordinator: listed while it runs,
shown stale once its heartbeats stop, reaped by a live coordinator later; a clean
stop removes a coordinator's row at once."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from dbworker import Coordinator
from dbworker.registry import Timing, list_coordinators
from waiting import wait_until

from .conftest import CoordinatorFactory
from .support import coordinator_process

# The PostgreSQL runs again through PgBouncer in transaction mode (tests/topologies).
pytestmark = pytest.mark.via("pgbouncer")

HEARTBEAT = 0.2
#: Short, so the survivor reaps within the test; longer than the stale threshold so
#: that the row is seen stale first.
TIMING = Timing(heartbeat=HEARTBEAT, stale_after=3, reap_after=3.0, stats=1.0)


def registered(coordinator: Coordinator, engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return list_coordinators(conn, coordinator._dialect, coordinator._registry_table(), TIMING)


def test_a_killed_coordinator_is_shown_stale_then_reaped(
    database_url: str, engine: Engine, workdir: Path, coordinators: CoordinatorFactory
) -> None:
    survivor = coordinators(lease_seconds=30, concurrency=1)  # creates the tables
    survivor._registry_timing = TIMING
    with coordinator_process(
        database_url, workdir / "first.log", lease_seconds=30, concurrency=2, heartbeat=HEARTBEAT
    ) as first:
        wait_until(
            lambda: [c["pid"] for c in registered(survivor, engine)] == [first.pid],
            "the first coordinator to register",
            diagnose=lambda: (registered(survivor, engine), (workdir / "first.log").read_text()),
        )
        [row] = registered(survivor, engine)
        assert row["workers"] == [{"name": "crash", "concurrency": 2, "executor": "Pool"}]
        assert not row["stale"]
        # Its heartbeat moves on while it lives.
        beat = row["heartbeat_at"]
        wait_until(
            lambda: registered(survivor, engine)[0]["heartbeat_at"] > beat,
            "the first coordinator's heartbeat",
        )

        os.kill(first.pid, signal.SIGKILL)
        assert first.wait() == -signal.SIGKILL
        wait_until(
            lambda: [c["stale"] for c in registered(survivor, engine)] == [True],
            "the killed coordinator to be shown stale",
            diagnose=lambda: registered(survivor, engine),
        )

    # Nobody reaps while no coordinator runs: the stale row stays visible.
    assert [c["pid"] for c in registered(survivor, engine)] == [first.pid]
    survivor.start()
    # The survivor's own row is live: it beats every HEARTBEAT, but a loaded machine
    # can hold its thread past the 0.6 s stale threshold for a moment, so this waits
    # for a beat rather than asserting on one reading.
    wait_until(
        lambda: (
            [(c["pid"], c["stale"]) for c in registered(survivor, engine)] == [(os.getpid(), False)]
        ),
        "the survivor to reap the killed coordinator's row and show its own live",
        diagnose=lambda: registered(survivor, engine),
    )
    survivor.stop()
    assert registered(survivor, engine) == []


def test_an_idle_coordinator_refreshes_its_figures_rarely() -> None:
    import time as _time

    from dbworker.registry import STATS_IDLE_SECONDS, Heartbeat

    done = [0]
    heartbeat = Heartbeat(None, None, None, [], "db", activity=lambda: done[0])  # type: ignore[arg-type]
    assert heartbeat._worth_refreshing(), "the first refresh is always due"
    heartbeat._refreshed_at = _time.monotonic()
    assert not heartbeat._worth_refreshing(), "nothing claimed or completed since"
    done[0] += 1
    assert heartbeat._worth_refreshing(), "work happened: the figures may have changed"
    heartbeat._refreshed_at = _time.monotonic() - STATS_IDLE_SECONDS
    assert heartbeat._worth_refreshing(), "idle, but the figures are old"
