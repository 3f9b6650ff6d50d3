"""Groups of lone finishes: where a group's one transaction would hold the database's
only write lock while its handlers run (SQLite), consecutive short items still share
their commit when they wrote nothing.

A no-op or read-only handler's ending is its FINISH alone: a statement of its own,
under the write lock (``Dialect.record_alone``). For short items that is most of what
an item costs: the process queues for the lock, takes it, writes, and hands it on, once
per item. Here a handler process given several short items at once (``group.py``'s
conditions: the coordinator sent them groupable, none has a timeout) runs them one
after the other as the single path does, save that the FINISH of each item whose
handler wrote nothing and finished is put off; once the group stops (after
``GROUP_SECONDS`` of work, ``GROUP_MAX_ITEMS`` items, another worker's item, or a
withdrawn one), they are recorded together, in one fenced statement of its own
(``Dialect.finish_all_alone``), and the group's results go back in one message. An item
that wrote, failed or returned Unfinished ends as it always does, in its turn, and the
group with it.

Nothing is held meanwhile: no transaction, no lock. If the process dies before the
statement commits, no FINISH of the group was recorded and the coordinator runs every
item of the group again, each alone (``ProcessPool._crashed``); they wrote nothing, so
nothing is written twice. An item whose claim was lost meanwhile is one the statement
did not match: LOST, as alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..core.policy import FINISHED
from ..core.tasks import Result, ResultKind, Task, TaskKey
from . import group
from .runtime import Runtime


def run_lone_finishes(
    runtime: Runtime, tasks: Sequence[Task], withdrawn: Callable[[TaskKey], bool]
) -> list[Result]:
    """Run ``tasks`` (one worker's, in claim order) as far as the group allows; their
    results, in order, once every FINISH put off is recorded. At least the first runs."""
    first = tasks[0]
    started = time.monotonic()
    results: list[Result] = []
    deferred: list[Task] = []
    runtime.deferred = deferred
    try:
        # group.py's bounds, read at each use (one setting for both kinds of group).
        for task in tasks[: group.GROUP_MAX_ITEMS]:
            if results and (
                time.monotonic() - started > group.GROUP_SECONDS
                or task.worker != first.worker
                or withdrawn(task.key)
            ):
                break
            put_off = len(deferred)
            results.append(runtime.run(task))
            if len(deferred) == put_off:
                # It ended in its turn, committed: its result goes back now (held back,
                # a crash later in the group would have it run again).
                break
    finally:
        runtime.deferred = None
    if not deferred:
        return results
    began = time.monotonic()
    ended = _record(runtime, deferred)
    share = (time.monotonic() - began) / len(deferred)
    return [
        replace(ended[result.task_key], duration=(result.duration or 0.0) + share)
        if result.task_key in ended
        else result
        for result in results
    ]


def _record(runtime: Runtime, deferred: list[Task]) -> dict[TaskKey, Result]:
    """Record the FINISH of every ``deferred`` item in one statement; each one's result
    (LOST where the statement did not match its claim). If the statement fails, each is
    recorded alone, as the single path would have (a failure then is that item's)."""
    first = deferred[0]
    worker = runtime.prepare(first.worker, first.source, first.keyed)
    try:
        connections = runtime.held.take()
    except Exception:
        return {task.key: _finish_alone(runtime, task) for task in deferred}
    try:
        matched = runtime.dialect.finish_all_alone(
            connections.write, worker, [(task.source_id, task.token) for task in deferred]
        )
    except Exception:
        runtime.held.drop()  # whatever state it is in, the statement did not commit
        return {task.key: _finish_alone(runtime, task) for task in deferred}
    runtime.held.done()
    return {
        task.key: Result(
            task.key, ResultKind.FINISHED if task.source_id in matched else ResultKind.LOST
        )
        for task in deferred
    }


def _finish_alone(runtime: Runtime, task: Task) -> Result:
    worker = runtime.prepare(task.worker, task.source, task.keyed)
    try:
        connections = runtime.held.take()
    except Exception as exc:
        return runtime.record_failure(task, worker, exc)
    try:
        done = runtime.dialect.record_alone(
            connections.write, worker, task.source_id, task.token, FINISHED
        )
    except Exception as exc:
        runtime.held.drop()
        return runtime.record_failure(task, worker, exc)
    runtime.held.done()
    return Result(task.key, ResultKind.FINISHED if done else ResultKind.LOST)
