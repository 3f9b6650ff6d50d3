"""Every log record about an item names it: worker, source_id and attempt, as LogRecord
attributes (for formats and structured log pipelines), not repeated in the message;
records about no item carry the attributes too, as None."""

from __future__ import annotations

import logging
import re

import pytest
from sqlalchemy import select, update

from dbworker import ExecutionStatus, RetryPolicy

from . import app
from .support import Site, check_item_records

OUTCOME = re.compile(r"^item (finished|unfinished|failed|retrying)\b")


def outcomes(records: list[logging.LogRecord]) -> set[tuple[int, int, str]]:
    found = set()
    for record in records:
        match = OUTCOME.search(record.getMessage())
        if match:
            found.add((record.__dict__["source_id"], record.__dict__["attempt"], match.group(1)))
    return found


def test_inline_outcomes_carry_item_context(ops: Site, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dbworker")
    coordinator = ops.coordinator(executor="inline")
    coordinator.transactional_worker(
        name="logged",
        source=app.Job,
        concurrency=2,
        retry=RetryPolicy(max_retries=1, base_delay=0.1, retry_on=(ValueError,)),
    )(app.run_job)
    coordinator.create_worker_tables()
    ops.add_jobs([1], app.QUICK)
    ops.add_jobs([2], app.UNFINISHED)
    ops.add_jobs([3], app.FAIL, fail_times=1, error="key")  # not retried
    ops.add_jobs([4], app.FAIL, fail_times=1, error="value")  # retried once
    coordinator.start()
    ops.wait_for_status(coordinator, "logged", [1, 2, 4], ExecutionStatus.FINISHED)
    ops.wait_for_status(coordinator, "logged", [3], ExecutionStatus.FAILED)
    coordinator.stop()

    items = check_item_records(caplog.records)
    assert {record.__dict__["worker"] for record in items} == {"logged"}
    assert outcomes(items) == {
        (1, 1, "finished"),
        (2, 1, "unfinished"),
        (2, 2, "finished"),
        (3, 1, "failed"),
        (4, 1, "retrying"),
        (4, 2, "finished"),
    }


def test_process_trouble_carries_item_context(ops: Site, caplog: pytest.LogCaptureFixture) -> None:
    """Crashes, timeouts, lost claims and giving up, with real handler processes."""
    caplog.set_level(logging.INFO, logger="dbworker")
    coordinator = ops.coordinator(lease_seconds=3)
    coordinator.transactional_worker(
        name="timed",
        source=app.Job,
        eligible=lambda: select(app.Job).where(app.Job.mode == app.SLEEP),
        timeout=1.0,
    )(app.run_job)
    coordinator.transactional_worker(
        name="fragile",
        source=app.Job,
        eligible=lambda: select(app.Job).where(app.Job.mode.in_([app.KILL, app.RELEASE])),
        concurrency=2,
        max_crashes=1,
    )(app.run_job)
    coordinator.create_worker_tables()
    ops.add_jobs([1], app.SLEEP, delay=600.0)
    ops.add_jobs([2], app.KILL)
    ops.add_jobs([3], app.RELEASE)
    coordinator.start()
    ops.wait_for_status(coordinator, "timed", [1], ExecutionStatus.FAILED)
    ops.wait_for_status(coordinator, "fragile", [2], ExecutionStatus.FAILED)

    # Job 3 loses its claim: as if another coordinator had taken it over.
    ops.wait_for_runs(3)
    table = coordinator.workers["fragile"].execution_table
    with ops.session_factory.begin() as session:
        session.execute(
            update(table).where(table.c.source_id == 3).values(token=table.c.token + 100)
        )
    # The next renewal finds out and stops the handler; the lease then runs out with
    # nobody renewing it, which counts as a crash, and max_crashes=1 ends it FAILED.
    ops.wait_for_status(coordinator, "fragile", [3], ExecutionStatus.FAILED)
    coordinator.stop()

    items = check_item_records(caplog.records)

    def said(source_id: int, text: str) -> bool:
        return any(r.__dict__["source_id"] == source_id and text in r.getMessage() for r in items)

    assert said(1, "timed out: handler of worker 'timed' ran longer than its timeout of 1.0s")
    assert said(2, "killed by SIGKILL")
    assert said(3, "lost its claim; handler stopped")
    assert said(3, "giving up")
    state = ops.state(coordinator, "fragile", 3)
    assert state is not None and state["error_type"] == "dbworker.WorkerCrashed"
