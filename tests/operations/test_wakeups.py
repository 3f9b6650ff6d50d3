"""Wake-ups: commits through the application's session factory start work at once;
polling stays the safety net (a rolled-back write wakes no one, a restarted server's
listener comes back, and without notifications everything still completes).

Coordinators here poll once a minute (``SLOW``): an item that completes well within
that was found by a wake-up. Nothing asserts on how long anything took.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import insert, select

from dbworker import Coordinator, ExecutionStatus
from dbworker.scheduling import Scheduler

from . import app
from .servers import PrivateServer
from .support import capture_dbworker_logs, site, wait_until

WORKER = "ops_wake"
#: Polling so rare that the tests' deadlines (WOKEN) end long before a poll is due, and
#: leases so long that no renewal wakes the scheduler before then either: a wake-up it
#: did not wait for would be noticed only at its next poll.
SLOW = {"poll_seconds": 60, "max_poll_seconds": 60, "lease_seconds": 600}
WOKEN = 30.0


def scheduler(coordinator: Coordinator) -> Scheduler:
    running = coordinator._scheduler
    assert running is not None, "the coordinator is not started"
    return running


def wait_ready(coordinator: Coordinator) -> None:
    """Until the coordinator receives wake-ups (its listener has connected)."""
    wakeups = scheduler(coordinator).wakeups
    assert wakeups is not None
    wait_until(wakeups.ready, "the coordinator to listen for wake-ups")


def started(coordinator: Coordinator, worker: str = WORKER) -> Coordinator:
    coordinator.transactional_worker(name=worker, source=app.Job, concurrency=2)(app.run_job)
    coordinator.create_worker_tables()
    coordinator.start()
    wait_ready(coordinator)
    return coordinator


def test_rolled_back_write_wakes_no_one_and_the_next_commit_still_does(
    database_url: str, tmp_path: Path
) -> None:
    with site(database_url, tmp_path / "work") as s:
        coordinator = started(s.coordinator(**SLOW))
        running = scheduler(coordinator)
        before = running.wakeups_received
        with s.session_factory() as session:
            session.add(app.Job(id=1, mode=app.QUICK, workdir=str(s.workdir)))
            session.flush()  # on PostgreSQL the NOTIFY is queued here, in the transaction
            session.rollback()
            # The same session goes on: its next transaction must announce again, not
            # take the rolled-back one's notification as already sent.
            session.add(app.Job(id=2, mode=app.QUICK, workdir=str(s.workdir)))
            session.commit()
        s.wait_for_status(coordinator, WORKER, [2], ExecutionStatus.FINISHED, timeout=WOKEN)
        # One wake-up: job 2's commit. A notification of the rolled-back transaction
        # would have arrived first.
        assert running.wakeups_received == before + 1
        assert s.runs(1) == []
        assert s.statuses(coordinator, WORKER, [1]) == {1: None}
        assert s.effects() == {2: 1}


def test_writes_outside_the_session_factory_are_found_by_polling(
    database_url: str, tmp_path: Path
) -> None:
    with site(database_url, tmp_path / "work") as s:
        coordinator = started(s.coordinator(poll_seconds=0.05, max_poll_seconds=0.5))
        with s.engine.begin() as conn:  # Core, not the session factory: no wake-up
            conn.execute(insert(app.Job), [{"id": 7, "mode": app.QUICK, "workdir": str(s.workdir)}])
        s.wait_for_status(coordinator, WORKER, [7], ExecutionStatus.FINISHED)
        assert s.effects() == {7: 1}


def test_without_notifications_everything_completes_by_polling(
    database_url: str, tmp_path: Path
) -> None:
    with site(database_url, tmp_path / "work") as s, capture_dbworker_logs() as logs:
        coordinator = s.coordinator(notifications=False)
        coordinator.transactional_worker(name=WORKER, source=app.Job, concurrency=2)(app.run_job)
        coordinator.create_worker_tables()
        coordinator.start()
        assert scheduler(coordinator).wakeups is None
        jobs = s.add_jobs(range(1, 9), app.QUICK)
        s.wait_for_status(coordinator, WORKER, jobs, ExecutionStatus.FINISHED)
        assert s.effects() == dict.fromkeys(jobs, 1)
        assert scheduler(coordinator).wakeups_received == 0
        said = [r.getMessage() for r in logs.snapshot() if "wake-ups off" in r.getMessage()]
        assert len(said) == 1, said


def test_a_dependent_worker_served_elsewhere_is_woken_when_its_prerequisite_completes(
    database_url: str, tmp_path: Path
) -> None:
    """Coordinator A runs ``first``; B runs ``then``, which waits for ``first`` to have
    FINISHED the job. Both poll once a minute: B hears of it from A."""
    with site(database_url, tmp_path / "work") as s:

        def register(coordinator: Coordinator, runs_first: bool) -> None:
            first_rows = select(app.Job).order_by(app.Job.id)
            coordinator.transactional_worker(
                name="ops_first",
                source=app.Job,
                eligible=(lambda: first_rows)
                if runs_first
                else (lambda: first_rows.where(app.Job.mode == "never")),
            )(app.run_job)
            done = coordinator.has_execution_status(
                worker="ops_first", source_id=app.Job.id, statuses=(ExecutionStatus.FINISHED,)
            )
            then_rows = select(app.Job).where(done).order_by(app.Job.id)
            # A's "then" never matches (an impossible mode) but still reads ops_first's
            # records, so A knows "then" depends on "first" and announces completions.
            coordinator.transactional_worker(
                name="ops_then",
                source=app.Job,
                eligible=(lambda: then_rows.where(app.Job.mode == "never"))
                if runs_first
                else (lambda: then_rows),
            )(app.run_job)

        a, b = s.coordinator(**SLOW), s.coordinator(**SLOW)
        register(a, runs_first=True)
        register(b, runs_first=False)
        a.create_worker_tables()
        for coordinator in (a, b):
            coordinator.start()
            wait_ready(coordinator)
        s.add_jobs([1], app.QUICK)
        s.wait_for_status(b, "ops_then", [1], ExecutionStatus.FINISHED, timeout=WOKEN)
        assert s.statuses(a, "ops_first", [1]) == {1: ExecutionStatus.FINISHED}
        assert len(s.runs(1)) == 2


@pytest.mark.backends("postgresql")
def test_notify_trigger_wakes_for_writes_dbworker_cannot_see(
    database_url: str, tmp_path: Path
) -> None:
    with site(database_url, tmp_path / "work") as s:
        coordinator = s.coordinator(**SLOW)
        coordinator.transactional_worker(name=WORKER, source=app.Job)(app.run_job)
        coordinator.create_worker_tables()
        coordinator.create_notify_triggers()
        coordinator.start()
        wait_ready(coordinator)
        running = scheduler(coordinator)
        before = running.wakeups_received
        row = {"mode": app.QUICK, "workdir": str(s.workdir)}
        with s.engine.connect() as conn:
            conn.execute(insert(app.Job), [{"id": 1, **row}])
            conn.rollback()  # the trigger's NOTIFY goes with it
            conn.execute(insert(app.Job), [{"id": 2, **row}])
            conn.commit()
        s.wait_for_status(coordinator, WORKER, [2], ExecutionStatus.FINISHED, timeout=WOKEN)
        assert running.wakeups_received == before + 1
        assert s.effects() == {2: 1}


@pytest.mark.slow
@pytest.mark.backends("postgresql")
def test_listener_reconnects_after_a_server_restart_and_nothing_is_lost(
    private_server: PrivateServer, tmp_path: Path
) -> None:
    with site(private_server.url, tmp_path / "work") as s, capture_dbworker_logs() as logs:
        coordinator = started(s.coordinator(**{**SLOW, "lease_seconds": 10}))
        wakeups = scheduler(coordinator).wakeups
        listener = wakeups.listener if wakeups is not None else None
        assert listener is not None
        first = s.add_jobs([1, 2], app.QUICK)
        s.wait_for_status(coordinator, WORKER, first, ExecutionStatus.FINISHED, timeout=WOKEN)
        # A handler in flight across the restart, and its item claimed again after it.
        held = s.add_jobs([3], app.RELEASE)
        s.wait_for_runs(3)

        private_server.restart("fast", down_seconds=1)
        wait_until(
            lambda: listener.connections >= 2 and listener.listening.is_set(),
            "the listener to reconnect",
        )
        s.open_gate(3)
        s.wait_for_status(coordinator, WORKER, held, ExecutionStatus.FINISHED)
        # Found at once (a completion polls no more): the new connection LISTENs again.
        after = s.add_jobs([4, 5, 6], app.QUICK)
        s.wait_for_status(coordinator, WORKER, after, ExecutionStatus.FINISHED, timeout=WOKEN)
        assert s.effects() == dict.fromkeys(first + held + after, 1)
        messages = [r.getMessage() for r in logs.snapshot()]
        assert any("listening connection was lost" in m for m in messages), messages
        assert any("listening for notifications again" in m for m in messages), messages
