"""The operator API (``coordinator.operations``) against every database: what the CLI,
the dashboard and the metrics are built on, read and steered directly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from dbworker import (
    ConfigurationError,
    Coordinator,
    DBWorkerError,
    ExecutionStatus,
    FailedRecord,
    LiveGauges,
    ServedWorker,
    UnknownWorkerError,
    WorkerLoad,
)
from dbworker.registry import Timing

from . import app
from .support import Site, wait_until
from .test_cli import worked

FAILED = ExecutionStatus.FAILED
FINISHED = ExecutionStatus.FINISHED


def test_backlog_failed_items_and_records(ops: Site) -> None:
    operations = worked(ops).operations
    figures = operations.backlog(live=True)
    assert list(figures) == ["jobs", "quick"]
    jobs = figures["jobs"]
    assert jobs.counts == {FINISHED: 2, FAILED: 2, ExecutionStatus.UNFINISHED: 1}
    # 5 waits for its delay: not claimable, so not waiting.
    assert (jobs.waiting, jobs.running, jobs.finished_last_minute) == (0, 0, 2)
    assert sum(jobs.history) == 2 and len(jobs.history) == 60
    assert not jobs.cached and jobs.age == 0.0
    assert figures["quick"].counts == {FINISHED: 2, None: 3}
    # No coordinator has counted (none runs): counted now either way.
    assert operations.backlog("quick")["quick"].counts == figures["quick"].counts
    assert not operations.backlog("quick")["quick"].cached

    failed = operations.failed_items("jobs")
    assert [f.source_id for f in failed] == [3, 4]
    assert all(f.error and f.error.startswith("ValueError") for f in failed)
    assert all(f.traceback is None for f in failed)
    [first] = operations.failed_items("jobs", limit=1, tracebacks=True)
    assert first.source_id == 3
    assert first.traceback and first.traceback.startswith("Traceback (most recent call last)")
    with ops.session_factory() as session:
        listed = operations.check_tables("jobs")[0].failed(session)
    # The same items as Worker.failed, field for field.
    assert [FailedRecord(**item) for item in listed] == failed

    record = operations.record("jobs", 3)
    assert record is not None and record.status == "failed" and record.attempts == 1
    assert record.owner is not None and record.owner["pid"] == os.getpid()  # drain's claim
    assert record.traceback and "ValueError" in record.traceback
    pending = operations.record("quick", 3)
    assert pending is not None and pending.status == "pending"
    assert pending.discovered_at is not None and pending.claimed_at is None
    assert operations.record("jobs", 99) is None
    assert operations.source_id("jobs", "3") == 3
    with pytest.raises(ConfigurationError, match="not a valid id"):
        operations.source_id("jobs", "three")


def test_retry_resets_failed_items_only(ops: Site) -> None:
    coordinator = worked(ops)
    operations = coordinator.operations
    assert operations.retry("jobs", 3) is True
    assert operations.retry("jobs", 3) is False  # not failed any more: left alone
    assert operations.retry_failed("jobs", [1, 4, 5]) == [4]
    assert operations.retry_failed("jobs") == []
    unfinished = ExecutionStatus.UNFINISHED
    assert ops.statuses(coordinator, "jobs", [1, 3, 4]) == {
        1: FINISHED,
        3: unfinished,
        4: unfinished,
    }


def test_unknown_workers_and_missing_tables_are_refused(ops: Site) -> None:
    coordinator = ops.coordinator()
    coordinator.transactional_worker(name="jobs", source=app.Job)(app.run_job)
    operations = coordinator.operations
    with pytest.raises(DBWorkerError, match="dbworker_jobs do not exist yet"):
        operations.check_tables()
    coordinator.workers["jobs"].execution_table.create(ops.engine)
    assert [w.name for w in operations.check_tables()] == ["jobs"]
    # The registry table is not there: coordinators cannot be listed, counts can.
    with pytest.raises(ConfigurationError, match="dbworker_coordinators does not exist yet"):
        operations.coordinators()
    assert operations.backlog()["jobs"].counts == {}
    for call in (
        lambda: operations.check_tables(["jobs", "nope"]),
        lambda: operations.backlog("nope"),
        lambda: operations.failed_items("nope"),
        lambda: operations.record("nope", 1),
        lambda: operations.retry("nope", 1),
    ):
        with pytest.raises(UnknownWorkerError, match="registered: jobs"):
            call()


def test_the_registry_and_the_live_gauges_of_a_running_coordinator(ops: Site) -> None:
    coordinator = ops.coordinator()
    coordinator.transactional_worker(name="jobs", source=app.Job, concurrency=2)(app.run_job)
    coordinator.create_worker_tables()
    # Counts every 0.1 s, but stale only after 5 s without a heartbeat: on a loaded
    # machine a beat can be late by more than the default three periods.
    coordinator._registry_timing = Timing(heartbeat=0.1, stats=0.1, stale_after=50)
    operations = coordinator.operations
    assert operations.live() == LiveGauges({"jobs": WorkerLoad(2, 0, 0)}, {}, None)
    assert operations.coordinators() == []
    ops.add_jobs([1], app.RELEASE)  # runs until its gate opens, holding no lock
    coordinator.start()
    try:
        ops.wait_for_runs(1)
        wait_until(lambda: operations.live().workers["jobs"] == WorkerLoad(2, 1, 1), "1 running")
        assert operations.live().workers["jobs"].free == 1
        [registered] = operations.coordinators()
        assert registered.alive and registered.pid == os.getpid()
        assert registered.workers == (ServedWorker("jobs", 2, "Pool"),)
        assert registered.heartbeat_age >= 0 and registered.uptime >= 0

        # The heartbeat counts the backlog for the metrics and for status everywhere.
        gauged = wait_until(lambda: operations.live().backlog.get("jobs"), "a cached count")
        assert gauged is not None and gauged.cached
        assert operations.live().backlog_age is not None
        wait_until(lambda: operations.backlog("jobs")["jobs"].cached, "a status from the cache")
        ops.open_gate(1)
        ops.wait_for_status(coordinator, "jobs", [1], FINISHED)
    finally:
        coordinator.stop()
    assert operations.coordinators() == []  # a clean stop deletes its row


@pytest.mark.backends("sqlite")
def test_a_missing_sqlite_file_is_reported_not_created(tmp_path: Path) -> None:
    path = tmp_path / "absent.sqlite"
    url = f"sqlite:///{path}"
    coordinator = Coordinator(sessionmaker(create_engine(url)), database_url=url)
    coordinator.transactional_worker(name="jobs", source=app.Job)(app.run_job)
    operations = coordinator.operations
    for call in (
        operations.check_tables,
        operations.backlog,
        operations.coordinators,
        lambda: operations.failed_items("jobs"),
        lambda: operations.retry_failed("jobs"),
    ):
        with pytest.raises(ConfigurationError, match="does not exist"):
            call()
    assert not path.exists()
