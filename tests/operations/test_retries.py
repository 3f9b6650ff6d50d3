"""Retry policies and delayed Unfinished, with real coordinators and handler processes.

Waiting is checked causally on the database's clock: every run records the clock
when it starts, and not_before is computed on the same clock after that reading, so
"run k+1 started at least `delay` after run k" holds exactly when dbworker honoured
not_before. No assertion depends on how fast anything ran.
"""

from __future__ import annotations

import itertools
from typing import Any

from dbworker import Coordinator, ExecutionState, ExecutionStatus, RetryPolicy

from . import app
from .support import Site, wait_until

#: The database clocks keep microseconds (SQLite: milliseconds, through a float
#: julian day); comparisons allow for that rounding, nothing more.
CLOCK_ROUNDING = 0.002


def start(ops: Site, name: str, **options: Any) -> Coordinator:
    coordinator = ops.coordinator()
    coordinator.transactional_worker(name=name, source=app.Job, **options)(app.run_job)
    coordinator.create_worker_tables()
    coordinator.start()
    return coordinator


def final_state(ops: Site, coordinator: Coordinator, name: str, job_id: int) -> ExecutionState:
    state = ops.state(coordinator, name, job_id)
    assert state is not None
    return state


def test_failing_twice_then_succeeding(ops: Site) -> None:
    policy = RetryPolicy(max_retries=3, base_delay=0.2, jitter=0.1)
    coordinator = start(ops, "retried", retry=policy)
    ops.add_jobs([1], app.FAIL, fail_times=2)
    ops.wait_for_status(coordinator, "retried", [1], ExecutionStatus.FINISHED)
    coordinator.stop()

    state = final_state(ops, coordinator, "retried", 1)
    assert (state["attempts"], state["failures"], state["crashes"]) == (3, 2, 0)
    # The last error is cleared once the work succeeds.
    assert (state["error"], state["error_type"], state["traceback"]) == (None, None, None)
    assert ops.effects() == {1: 1}
    runs = [db_time for db_time, _ in ops.runs(1)]
    assert len(runs) == 3
    # Each retry waited out its backoff: 0.2 s, then 0.4 s, each -10% jitter at most.
    for number, (before, after) in enumerate(itertools.pairwise(runs)):
        least = policy.base_delay * 2**number * (1 - policy.jitter)
        assert after - before >= least - CLOCK_ROUNDING, (number, runs)


def test_retries_exhausted(ops: Site) -> None:
    coordinator = start(ops, "retried_once", retry=RetryPolicy(max_retries=1, base_delay=0.2))
    ops.add_jobs([1], app.FAIL, fail_times=2)
    ops.wait_for_status(coordinator, "retried_once", [1], ExecutionStatus.FAILED)
    coordinator.stop()

    state = final_state(ops, coordinator, "retried_once", 1)
    assert (state["attempts"], state["failures"]) == (2, 1)
    assert state["error"] == "RuntimeError: job 1 run 2 failed on purpose"
    assert len(ops.runs(1)) == 2
    assert ops.effects() == {}


def test_retry_on_limits_the_exceptions_retried(ops: Site) -> None:
    policy = RetryPolicy(max_retries=3, base_delay=0.2, retry_on=(ValueError,))
    coordinator = start(ops, "picky", retry=policy, concurrency=2)
    retried = ops.add_jobs([1], app.FAIL, fail_times=1, error="value")
    not_retried = ops.add_jobs([2], app.FAIL, fail_times=1, error="key")
    ops.wait_for_status(coordinator, "picky", retried, ExecutionStatus.FINISHED)
    ops.wait_for_status(coordinator, "picky", not_retried, ExecutionStatus.FAILED)
    coordinator.stop()

    state = final_state(ops, coordinator, "picky", 2)
    assert (state["attempts"], state["failures"], state["error_type"]) == (1, 0, "KeyError")
    assert len(ops.runs(2)) == 1
    assert final_state(ops, coordinator, "picky", 1)["failures"] == 1
    assert ops.effects() == {1: 1}


def test_no_policy_fails_at_once(ops: Site) -> None:
    coordinator = start(ops, "unretried")
    ops.add_jobs([1], app.FAIL, fail_times=1)
    ops.wait_for_status(coordinator, "unretried", [1], ExecutionStatus.FAILED)
    coordinator.stop()
    state = final_state(ops, coordinator, "unretried", 1)
    assert (state["attempts"], state["failures"]) == (1, 0)
    assert len(ops.runs(1)) == 1


def test_unfinished_delay_is_honoured(ops: Site) -> None:
    delay = 1.0
    coordinator = start(ops, "later")
    ops.add_jobs([1], app.UNFINISHED, delay=delay)

    # Watch the record between the two runs, to read not_before while it is set.
    not_before: list[float] = []

    def finished() -> bool:
        state = ops.state(coordinator, "later", 1)
        if state is None:
            return False
        if state["execution_status"] is ExecutionStatus.UNFINISHED:
            assert state["not_before"] is not None
            not_before.append(state["not_before"].timestamp())
        return state["execution_status"] is ExecutionStatus.FINISHED

    wait_until(finished, "job 1 to finish after its delay")
    coordinator.stop()

    (first, _), (second, _) = ops.runs(1)
    state = final_state(ops, coordinator, "later", 1)
    assert state["attempts"] == 2 and state["not_before"] is None
    assert state["claimed_at"] is not None
    claimed = state["claimed_at"].timestamp()
    # not_before was set after run 1 read the clock; the second claim and run came
    # after not_before.
    assert claimed >= first + delay - CLOCK_ROUNDING, (first, claimed)
    assert second >= claimed - CLOCK_ROUNDING
    for value in not_before:
        assert first + delay - CLOCK_ROUNDING <= value <= claimed + CLOCK_ROUNDING
    assert ops.effects() == {1: 1}
