"""What ``state()`` tells an operator about an execution, and that it stays bounded."""

from __future__ import annotations

import datetime as dt
import os
import socket

from dbworker import ExecutionState, ExecutionStatus, FailedItem
from dbworker.core.tasks import MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS

from . import app
from .support import Site, capture_dbworker_logs

PUBLIC_FIELDS = {
    "execution_status",
    "error",
    "lease_expires_at",
    "error_type",
    "traceback",
    "attempts",
    "failures",
    "crashes",
    "not_before",
    "claimed_at",
    "finished_at",
    "updated_at",
    "owner",
}


def test_failure_record(ops: Site) -> None:
    coordinator = ops.coordinator()
    coordinator.transactional_worker(name="records", source=app.Job, concurrency=2)(app.run_job)
    coordinator.create_worker_tables()
    ops.add_jobs([1], app.FAIL, fail_times=1, error="policy")
    ops.add_jobs([2], app.QUICK)
    coordinator.start()
    ops.wait_for_status(coordinator, "records", [1], ExecutionStatus.FAILED)
    ops.wait_for_status(coordinator, "records", [2], ExecutionStatus.FINISHED)
    coordinator.stop()

    state = ops.state(coordinator, "records", 1)
    assert state is not None
    # Exactly the documented fields: in particular no fencing token. The TypedDict
    # that types them names the same keys.
    assert set(state) == PUBLIC_FIELDS == ExecutionState.__required_keys__
    with ops.session_factory() as session:
        [failed] = coordinator.workers["records"].failed(session)
    assert set(failed) == FailedItem.__required_keys__
    assert not any("token" in key for key in state)
    assert state["error"] == "PolicyError: job 1 run 1 failed on purpose"
    assert state["error_type"] == f"{app.__name__}.PolicyError"
    trace = state["traceback"]
    assert trace is not None and trace.startswith("Traceback (most recent call last):")
    assert "raise PolicyError(message)" in trace
    assert trace.rstrip().endswith(state["error"])
    assert (state["attempts"], state["failures"], state["crashes"]) == (1, 0, 0)
    # The coordinator process claimed it (its handler ran in a child process).
    assert state["owner"] == {"host": socket.gethostname(), "pid": os.getpid()}
    times = [state[key] for key in ("claimed_at", "finished_at", "updated_at")]
    assert all(isinstance(t, dt.datetime) and t.tzinfo is not None for t in times)
    claimed_at, finished_at, updated_at = times
    assert claimed_at is not None and finished_at is not None and updated_at is not None
    assert claimed_at <= finished_at <= updated_at
    assert (state["lease_expires_at"], state["not_before"]) == (None, None)

    # A success has timestamps too, and no error.
    done = ops.state(coordinator, "records", 2)
    assert done is not None and set(done) == PUBLIC_FIELDS
    assert (done["error"], done["error_type"], done["traceback"]) == (None, None, None)
    assert done["claimed_at"] is not None and done["finished_at"] is not None
    assert done["claimed_at"] <= done["finished_at"]


def test_huge_exception_message_is_stored_bounded(ops: Site) -> None:
    coordinator = ops.coordinator()
    coordinator.transactional_worker(name="records", source=app.Job)(app.run_job)
    coordinator.create_worker_tables()
    ops.add_jobs([1], app.HUGE)
    with capture_dbworker_logs() as logs:
        coordinator.start()
        ops.wait_for_status(coordinator, "records", [1], ExecutionStatus.FAILED)
        coordinator.stop()

    state = ops.state(coordinator, "records", 1)
    assert state is not None
    assert state["error_type"] == "RuntimeError"
    error, trace = state["error"], state["traceback"]
    assert error is not None and trace is not None
    assert error.startswith("RuntimeError: xxxx")
    assert len(error) <= MAX_ERROR_CHARS
    assert error.endswith("characters cut]")
    assert len(trace) <= MAX_TRACEBACK_CHARS
    assert trace.startswith("Traceback (most recent call last):")
    # Logs are bounded too: a megabyte per failure would swamp any log pipeline.
    longest = max(len(record.getMessage()) for record in logs.snapshot())
    assert longest <= MAX_ERROR_CHARS + 1000
