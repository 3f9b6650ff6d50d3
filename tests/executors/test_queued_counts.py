"""The event loop and threads executors count, per process, the tasks sent ahead that
have not started there (``MultiplexedPool._queued_in``), instead of scanning the
process's tasks on every pass of the scheduler and for every task sent. Whatever
happens to the tasks (claims, starts, results, cancels, a crash), the count is what the
scan would find, and a process's busy slots are what they were."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dbworker.core.tasks import Result, ResultKind
from dbworker.executors.multiplexed import MultiplexedPool
from dbworker.executors.multiplexed_child import CANCELLED, STARTED

from .test_batched_reads import _task
from .test_endings_hold_no_slot import one_process_pool

ROOM = 4

steps = st.lists(
    st.tuples(
        st.sampled_from(["claim", "start", "finish", "cancel", "crash"]),
        st.integers(min_value=1, max_value=ROOM * 3),
    ),
    max_size=40,
)


def _scanned_busy(executor: MultiplexedPool, child: Any) -> int:
    """``_busy`` as it was computed, by a scan of the process's tasks."""
    waiting = sum(1 for task in child.tasks if task.key in executor._queued)
    return min(len(child.tasks) - waiting, ROOM) + waiting


@settings(max_examples=200, deadline=None)
@given(steps=steps, asyncio=st.booleans())
def test_the_count_of_tasks_ahead_is_what_a_scan_finds(
    steps: list[tuple[str, int]], asyncio: bool
) -> None:
    numbers = iter(range(10_000))
    with one_process_pool(ROOM, asyncio=asyncio) as (executor, child, _):
        for action, n in steps:
            waiting = [t for t in child.tasks if t.key in executor._queued]
            running = [t for t in child.tasks if t.key not in executor._queued]
            results: list[Result] = []
            if action == "claim":
                executor.submit_all([_task(next(numbers)) for _ in range(executor.free_slots())])
            elif action == "start" and waiting:
                executor._read(child, (STARTED, [t.key for t in waiting[:n]], None), results)
            elif action == "finish" and running:
                for task in running[:n]:
                    executor._read(child, Result(task.key, ResultKind.FINISHED), results)
            elif action == "cancel" and child.tasks:
                # A task the process dropped, whether it had started or not.
                task = list(child.tasks)[n % len(child.tasks)]
                executor._read(child, (CANCELLED, task.key), results)
            elif action == "crash":
                executor._take_tasks(child)
            scanned = sum(1 for task in child.tasks if task.key in executor._queued)
            assert executor._queued_in[id(child)] == scanned
            assert executor._busy(child) == _scanned_busy(executor, child)
            assert executor._queued <= {task.key for task in child.tasks}
