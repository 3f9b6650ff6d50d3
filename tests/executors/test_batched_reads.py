"""A process with a full pipe of short tasks has its results read in batches: the
scheduler is not woken by each of them, but by a deadline when the process is expected
to be one task down; its death still wakes the scheduler at once. How full a pipe gets:
up to PIPE_DEPTH (and the prefetch depth) while invocations are short, only the running
task for a while after one ran long."""

from __future__ import annotations

import collections
import multiprocessing
import time
from typing import Any

import pytest

from dbworker.core.tasks import Task
from dbworker.executors.children import Child
from dbworker.executors.pool import ProcessPool
from dbworker.executors.prefetch import (
    BATCHED_READS_FROM,
    LONG_INVOCATION_SECONDS,
    PEAK_HALF_LIFE_SECONDS,
    PIPE_DEPTH,
)


class _Process:
    """Stands in for a running process: only what wait_handles() reads."""

    sentinel = 12345
    exitcode = None

    def is_alive(self) -> bool:
        return True


def _task(n: int) -> Task:
    return Task("w", n, 1, 1, 0, print, object)


@pytest.fixture
def rig() -> Any:
    parent, child_end = multiprocessing.Pipe()
    executor = ProcessPool(1, runner=None, parent_pid=0, prefetch=4)  # type: ignore[arg-type]
    child = Child(_Process(), parent)  # type: ignore[arg-type]
    child.ready = True
    executor._children.append(child)
    yield executor, child
    parent.close()
    child_end.close()


def _pipe_takes(executor: ProcessPool, child: Child) -> int:
    """How many tasks the pipe of ``child`` (streaming short tasks) takes in all."""
    now = time.monotonic()
    child.last_done = now
    child.tasks = collections.deque()
    while executor._takes_more(child, now, executor._policy.pipe_depth):
        child.tasks.append(_task(len(child.tasks)))
    return len(child.tasks)


def _measured(executor: ProcessPool, duration: float) -> None:
    """An invocation of ``executor``'s took ``duration`` and ended now."""
    executor._policy.measured(duration, time.monotonic())


def test_a_full_pipe_of_short_tasks_is_read_by_a_deadline(rig: Any) -> None:
    executor, child = rig
    _measured(executor, 0.001)
    full = _pipe_takes(executor, child)  # prefetch 4: five, not PIPE_DEPTH
    assert BATCHED_READS_FROM <= full < PIPE_DEPTH
    child.tasks = collections.deque(_task(n) for n in range(full))
    child.started = time.monotonic()
    handles = executor.wait_handles()
    assert child.conn not in handles, "its next results can wait"
    assert child.process.sentinel in handles, "a death must still wake the scheduler"
    assert executor.collect_by() == pytest.approx(child.started + 0.001)


def test_a_process_near_the_end_of_its_pipe_wakes_the_scheduler(rig: Any) -> None:
    executor, child = rig
    _measured(executor, 0.001)
    full = _pipe_takes(executor, child)
    child.tasks = collections.deque(_task(n) for n in range(full - 1))
    child.started = time.monotonic()
    assert child.conn in executor.wait_handles()
    assert executor.collect_by() is None


def test_results_are_read_at_once_until_durations_are_known(rig: Any) -> None:
    executor, child = rig
    child.tasks = collections.deque(_task(n) for n in range(BATCHED_READS_FROM))
    child.started = time.monotonic()
    assert child.conn in executor.wait_handles()
    assert executor.collect_by() is None


def test_a_missed_deadline_puts_the_pipe_back_among_the_handles(rig: Any) -> None:
    executor, child = rig
    _measured(executor, 0.001)
    child.tasks = collections.deque(_task(n) for n in range(_pipe_takes(executor, child)))
    child.started = time.monotonic() - 1.0
    assert child.conn in executor.wait_handles()
    assert executor.collect_by() is None


def test_short_invocations_fill_the_pipe(rig: Any) -> None:
    executor, child = rig
    for _ in range(10):
        _measured(executor, 0.001)
    assert _pipe_takes(executor, child) == min(PIPE_DEPTH, executor._policy.depth) > 1


def test_after_a_long_invocation_only_the_running_task_is_in_the_pipe(rig: Any) -> None:
    executor, child = rig
    _measured(executor, LONG_INVOCATION_SECONDS * 2)
    for _ in range(1000):  # short ones since: the prefetch depth is back up
        _measured(executor, 0.001)
    assert executor._policy.depth > 1
    assert _pipe_takes(executor, child) == 1


def test_a_hiccup_shorter_than_a_long_invocation_keeps_the_pipe(rig: Any) -> None:
    executor, child = rig
    _measured(executor, 0.001)
    _measured(executor, LONG_INVOCATION_SECONDS / 10)  # a slow commit, say
    for _ in range(100):
        _measured(executor, 0.001)
    assert _pipe_takes(executor, child) == min(PIPE_DEPTH, executor._policy.depth) > 1


def test_a_long_invocation_is_forgotten_with_time(rig: Any) -> None:
    executor, child = rig
    _measured(executor, LONG_INVOCATION_SECONDS * 2)
    later = time.monotonic() + 2 * PEAK_HALF_LIFE_SECONDS
    for _ in range(100):
        executor._policy.measured(0.001, later)
    assert _pipe_takes(executor, child) == min(PIPE_DEPTH, executor._policy.depth) > 1
