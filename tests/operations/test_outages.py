"""The database goes away mid-run; every item still ends FINISHED with its effect once.

PostgreSQL and MariaDB run on a private server (see servers.py) that the test stops
and starts while handlers are in flight. SQLite is "down" while another connection
holds its write lock.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import exc as sa_exc

from dbworker import Coordinator, ExecutionStatus, RetryPolicy
from dbworker.executors.prefetch import PREFETCH_HORIZON_SECONDS

from . import app
from .servers import PrivateServer
from .support import (
    Site,
    capture_dbworker_logs,
    check_item_records,
    open_engine,
    site,
    wait_until,
    watch_health,
)

WORKER = "ops_outage"
#: Short enough that the outage below outlasts it, so every lease has expired on the
#: database's clock by the time the server is back.
LEASE_SECONDS = 4.0


@pytest.mark.slow
@pytest.mark.backends("postgresql", "mysql")
@pytest.mark.parametrize("outage", ["fast", "immediate"])
def test_database_restart_with_handlers_in_flight(
    private_server: PrivateServer, outage: str, tmp_path: Path
) -> None:
    with site(private_server.url, tmp_path / "work") as s, capture_dbworker_logs() as logs:
        # Polling alone: the queued jobs below must be claimed only after the restart.
        # Woken at their commit, they would be claimed a few ms after the warm-up's last
        # handler returned, while the pool still counts its processes as streaming short
        # tasks, and would wait in the pipes of the HOLD handlers (the pool's prefetch).
        coordinator = s.coordinator(lease_seconds=LEASE_SECONDS, notifications=False)
        # No retry policy: a handler whose transaction dies with the server is run
        # again because the error is the database's (transient), not the handler's.
        coordinator.transactional_worker(name=WORKER, source=app.Job, concurrency=4)(app.run_job)
        coordinator.create_worker_tables()

        # Warm up: every handler process ends up with a pooled connection that the
        # restart will leave dead.
        warm = s.add_jobs(range(1, 5), app.QUICK)
        coordinator.start()
        s.wait_for_status(coordinator, WORKER, warm, ExecutionStatus.FINISHED)
        # Past the prefetch horizon: a poll that found the jobs below within it of the
        # warm-up's last result would send queued jobs into the HOLD handlers' pipes.
        time.sleep(4 * PREFETCH_HORIZON_SECONDS)

        # In flight across the outage: HOLD handlers keep their transaction (with the
        # effect flushed) open; RELEASE handlers hold no connection while they wait.
        # Job 11 is let go during the outage, job 12 after it.
        held = s.add_jobs([11, 12], app.HOLD)
        released = s.add_jobs([13, 14], app.RELEASE)
        # Queued behind them (every slot is busy), claimed only after the restart.
        queued = s.add_jobs(range(21, 29), app.QUICK)
        for job_id in held + released:
            s.wait_for_runs(job_id)
        assert s.statuses(coordinator, WORKER, queued) == dict.fromkeys(queued)

        with watch_health(coordinator) as health:
            stopped = time.monotonic()
            private_server.stop("fast" if outage == "fast" else "immediate")
            wait_until(lambda: health.saw_outage, "health() to report the outage")
            # Job 11 completes while the server is down: its outcome cannot be written
            # by the handler process, so the coordinator must keep it and write it later.
            s.open_gate(11)
            wait_until(
                lambda: any(getattr(r, "source_id", None) == 11 for r in logs.snapshot()),
                "the coordinator to hear of job 11's unrecorded outcome",
            )
            # Stay down past a whole lease: renewals fail, every lease expires.
            time.sleep(max(0.0, LEASE_SECONDS + 1 - (time.monotonic() - stopped)))
            private_server.start()
            # Job 11's retry runs only after the coordinator is back and has claimed
            # again; jobs 12-14 are still running then, their leases long expired.
            s.wait_for_runs(11, 2)
            for job_id in (12, 13, 14):
                s.open_gate(job_id)
            everything = warm + held + released + queued
            s.wait_for_status(coordinator, WORKER, everything, ExecutionStatus.FINISHED)
            wait_until(lambda: coordinator.health().database_ok, "health() to recover")

        assert s.effects() == dict.fromkeys(everything, 1)
        assert health.errors and health.error_times, "health() never said what it saw"
        assert coordinator.health().running and coordinator.health().crashed is None
        for job_id in held:
            # Run 1's transaction died with the server; run 2 committed.
            state = s.state(coordinator, WORKER, job_id)
            assert state is not None
            assert (len(s.runs(job_id)), state["failures"], state["crashes"]) == (2, 1, 0)
            assert state["error"] is None
        for job_id in released + queued:
            # Nothing of theirs touched the dead server: one run, no failure, and the
            # coordinator kept its expired claims (no takeover of its own items).
            state = s.state(coordinator, WORKER, job_id)
            assert state is not None
            assert (len(s.runs(job_id)), state["failures"], state["crashes"]) == (1, 0, 0), (
                job_id,
                state,
            )
        coordinator.stop()
        check_item_records(logs.snapshot())


@contextlib.contextmanager
def _write_locked(path: Path) -> Iterator[None]:
    """SQLite's write lock held by a connection outside dbworker, for the block."""
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        yield
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


def _two_running_six_waiting(s: Site, coordinator: Coordinator) -> tuple[list[int], list[int]]:
    """Start ``coordinator`` with two jobs running (held at their gates) and six waiting."""
    coordinator.create_worker_tables()
    running = s.add_jobs([1, 2], app.RELEASE)
    waiting = s.add_jobs(range(3, 9), app.QUICK)
    coordinator.start()
    for job_id in running:
        s.wait_for_runs(job_id)
    return running, waiting


def test_sqlite_write_lock_held_by_another_connection(tmp_path: Path) -> None:
    """A writer outside dbworker holds SQLite's lock for a while (shorter than the busy
    timeout): claims, renewals and handlers wait, then everything completes."""
    path = tmp_path / "busy.sqlite"
    url = f"sqlite:///{path}"
    with site(url, tmp_path / "work") as s:
        coordinator = s.coordinator()
        coordinator.transactional_worker(name=WORKER, source=app.Job, concurrency=2)(app.run_job)
        running, waiting = _two_running_six_waiting(s, coordinator)

        with watch_health(coordinator) as health:
            with _write_locked(path):
                for job_id in running:
                    s.open_gate(job_id)
                # The handlers, claims and renewals now wait on the lock.
                time.sleep(3)
            s.wait_for_status(coordinator, WORKER, running + waiting, ExecutionStatus.FINISHED)
        assert s.effects() == dict.fromkeys(running + waiting, 1)
        # Waiting within the busy timeout is not an error.
        assert not health.saw_outage and not health.errors, health


def test_sqlite_lock_held_past_a_short_busy_timeout(tmp_path: Path) -> None:
    """With a busy timeout shorter than the lock is held (connect_args), dbworker's
    statements fail with "database is locked": the coordinator reports it, backs off,
    and completes everything once the lock is released."""
    path = tmp_path / "busy.sqlite"
    url = f"sqlite:///{path}"
    short = {"connect_args": {"timeout": 0.2}}
    # The test's own engine keeps the long default: its status reads must wait, not fail.
    with site(url, tmp_path / "work") as s, capture_dbworker_logs() as logs:
        coordinator = s.coordinator(engine_options=short)
        coordinator.transactional_worker(
            name=WORKER,
            source=app.Job,
            concurrency=2,
            retry=RetryPolicy(max_retries=5, base_delay=0.2, retry_on=(sa_exc.OperationalError,)),
        )(app.run_job)
        running, waiting = _two_running_six_waiting(s, coordinator)

        with watch_health(coordinator) as health:
            with _write_locked(path):
                for job_id in running:
                    s.open_gate(job_id)
                wait_until(lambda: health.saw_outage, "health() to report the locked database")
            s.wait_for_status(coordinator, WORKER, running + waiting, ExecutionStatus.FINISHED)
            wait_until(lambda: coordinator.health().database_ok, "health() to recover")
        assert any("locked" in error for error in health.errors), health.errors
        assert s.effects() == dict.fromkeys(running + waiting, 1)
        coordinator.stop()
        check_item_records(logs.snapshot())


@pytest.mark.parametrize(
    ("url_query", "options", "expected_ms"),
    [
        ("", {}, 30_000),
        ("", {"connect_args": {"timeout": 0.2}}, 200),
        ("?timeout=1.5", {}, 1_500),
    ],
    ids=["default", "connect_args", "url"],
)
def test_sqlite_busy_timeout_is_configurable(
    tmp_path: Path, url_query: str, options: dict[str, object], expected_ms: int
) -> None:
    """dbworker's 30 s default applies unless the engine options choose another."""
    url = f"sqlite:///{tmp_path / 'timeout.sqlite'}{url_query}"
    engine = open_engine(url, **options)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == expected_ms
    finally:
        engine.dispose()
