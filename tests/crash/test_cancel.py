"""Cancellation with real coordinators and handler processes (issue 24).

A running item's handler is stopped and its writes roll back; an item not yet claimed,
one never discovered and an unfinished one never run until ``reset_failed``. The wait
for a stopped handler is generous (``waiting.DEADLINE``) and the coordinators' own
polls and renewals are much slower than that where a wake-up is what is tested, so a
handler gone in time was stopped by the wake-up.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from backends import BackendName
from dbworker import (
    Coordinator,
    Event,
    EventKind,
    ExecutionStatus,
    UnknownWorkerError,
)
from dbworker.core.transitions import Transition
from dbworker.dialects import Owner
from waiting import pid_alive, wait_until

from . import app
from .support import add_items, effects, make_coordinator, runs, state, wait_for_run

# The PostgreSQL runs again through PgBouncer in transaction mode (tests/topologies).
pytestmark = pytest.mark.via("pgbouncer")

#: Longer than any wait of these tests: the scheduler's periodic check of what it
#: holds (every max_poll_seconds) and its renewals (every lease / 3) never come first.
SLOW = 600.0


def _coordinator(
    engine: Engine, url: str, *, max_poll_seconds: float, notifications: bool = True
) -> Coordinator:
    return make_coordinator(
        engine,
        url,
        lease_seconds=SLOW,
        concurrency=1,
        max_poll_seconds=max_poll_seconds,
        notifications=notifications,
    )


def _cancel(coordinator: Coordinator, engine: Engine, item_id: int) -> bool:
    with Session(engine) as session:
        cancelled = coordinator.cancel(session, worker=app.WORKER, source_id=item_id)
        session.commit()
    return cancelled


def _assert_cancelled(coordinator: Coordinator, engine: Engine, item_id: int) -> None:
    found = state(coordinator, engine, item_id)
    assert found is not None
    assert found["execution_status"] is ExecutionStatus.FAILED
    assert found["error_type"] == "dbworker.Cancelled"
    assert "cancelled" in (found["error"] or "")


def _stops_running_handler(
    engine: Engine, url: str, workdir: Path, coordinator: Coordinator, mode: str
) -> None:
    events: list[Event] = []
    coordinator.events.subscribe(events.append)
    add_items(engine, workdir, [mode])
    try:
        coordinator.start()
        child = wait_for_run(workdir, 1, 1)
        if mode == app.WRITE_GATE:
            flushed = app.marker_path(workdir, "flushed", 1, 1)
            wait_until(flushed.exists, "the handler to write its effect")
        assert _cancel(coordinator, engine, 1) is True
        # The gate stays shut: only the coordinator can end this handler.
        wait_until(lambda: not pid_alive(child), "the coordinator to stop the cancelled handler")
        wait_until(
            lambda: any(e.kind is EventKind.CANCELLED for e in events), "the cancelled event"
        )
    finally:
        coordinator.stop(timeout=0)
    assert not app.marker_path(workdir, "passed", 1, 1).exists(), "the handler reached its end"
    assert effects(engine) == [], "the cancelled handler's writes committed"
    _assert_cancelled(coordinator, engine, 1)
    assert runs(workdir, 1) == [child]
    cancelled = [e for e in events if e.kind is EventKind.CANCELLED]
    assert [(e.source_id, e.attempt) for e in cancelled] == [(1, 1)]
    assert EventKind.LOST not in {e.kind for e in events}


@pytest.mark.parametrize("mode", [app.GATE, app.WRITE_GATE])
def test_a_wake_up_stops_a_cancelled_handler(
    engine: Engine, database_url: str, backend: BackendName, workdir: Path, mode: str
) -> None:
    """PostgreSQL: the cancel's NOTIFY; elsewhere the same-host channel. Polls, checks
    and renewals are minutes apart, so only the wake-up can stop the handler in time."""
    if mode == app.WRITE_GATE and backend == "sqlite":
        pytest.skip(
            "a SQLite handler that wrote holds the database's write lock: no one can cancel"
        )
    coordinator = _coordinator(engine, database_url, max_poll_seconds=SLOW)
    _stops_running_handler(engine, database_url, workdir, coordinator, mode)


def test_the_periodic_check_stops_a_cancelled_handler(
    engine: Engine, database_url: str, workdir: Path
) -> None:
    """Without wake-ups (another host, no NOTIFY) the holder checks what it holds every
    max_poll_seconds."""
    coordinator = _coordinator(engine, database_url, max_poll_seconds=0.2, notifications=False)
    _stops_running_handler(engine, database_url, workdir, coordinator, app.GATE)


def test_cancelled_items_never_run_until_reset(
    engine: Engine, database_url: str, workdir: Path
) -> None:
    coordinator = _coordinator(engine, database_url, max_poll_seconds=0.2)
    events: list[Event] = []
    coordinator.events.subscribe(events.append)
    worker = coordinator._registration(app.WORKER)
    dialect = coordinator._dialect
    add_items(engine, workdir, [app.QUICK, app.QUICK])
    # Item 2 UNFINISHED (a run returned Unfinished), item 1 pending, item 3 never
    # discovered: inserted after the discovery.
    with engine.begin() as conn:
        dialect.discover(conn, worker.table)
        eligible = worker.eligible_query().where(app.Item.id == 2)
        (claim,) = dialect.claim(conn, worker.table, eligible, 1, 60, Owner("test", 1))
        assert dialect.transition(conn, worker.table, Transition.UNFINISH, 2, claim.token, delay=0)
    with Session(engine) as session, session.begin():
        session.add(app.Item(id=3, mode=app.QUICK, workdir=str(workdir)))
    assert state(coordinator, engine, 3) is None

    for item_id in (1, 2, 3):
        assert _cancel(coordinator, engine, item_id) is True
        _assert_cancelled(coordinator, engine, item_id)
    reported = [(e.kind, e.source_id, e.attempt) for e in events]
    assert reported == [(EventKind.CANCELLED, i, None) for i in (1, 2, 3)]

    # A cancel the caller rolls back never happened.
    with Session(engine) as session, session.begin():
        session.add(app.Item(id=4, mode=app.QUICK, workdir=str(workdir)))
    with Session(engine) as session:
        assert coordinator.cancel(session, worker=app.WORKER, source_id=4) is True
        session.rollback()
    assert state(coordinator, engine, 4) is None

    report = coordinator.drain()
    assert [(i.source_id, i.outcome) for i in report.items] == [(4, "finished")]
    assert [runs(workdir, i) for i in (1, 2, 3)] == [[], [], []]

    with Session(engine) as session:
        for item_id in (1, 2, 3):
            assert coordinator.workers[app.WORKER].reset_failed(session, item_id)
        session.commit()
    report = coordinator.drain()
    assert sorted((i.source_id, i.outcome) for i in report.items) == [
        (1, "finished"),
        (2, "finished"),
        (3, "finished"),
    ]

    finished = state(coordinator, engine, 1)
    assert _cancel(coordinator, engine, 1) is False, "cancelling a finished item"
    assert state(coordinator, engine, 1) == finished
    assert len([e for e in events if e.kind is EventKind.CANCELLED]) == 3
    with Session(engine) as session, pytest.raises(UnknownWorkerError, match="nope"):
        coordinator.cancel(session, worker="nope", source_id=1)
    assert coordinator.operations.cancel(app.WORKER, 2) is False
