"""What handler processes do around an invocation: results read before deaths, and
rehearsals that change nothing.

The pool reads a process's last result even when the process has exited since.

A spawn-per-task process sends its result and exits at once, so the coordinator
can see it dead before it has read the result. Found by the executors benchmark
(one item in a few hundred was reported as a crash with exit status 0); here the
race is made certain with a stand-in process that answers and exits as soon as the
pool checks whether it is alive.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from sqlalchemy import select

from dbworker.core.status import Phase
from dbworker.core.tasks import Result, ResultKind, Task
from dbworker.executors.pool import ProcessPool
from dbworker.executors.process import send
from dbworker.invocation import ChildConfig, ProcessRunner, Runtime

from . import app
from .support import Rig


class AnswersThenExits:
    """A process that, the moment anyone looks, sends its result and exits cleanly:
    the worst timing for the coordinator, made certain."""

    exitcode = 0
    sentinel = None

    def __init__(self) -> None:
        self.last_words: tuple[Any, Result] | None = None

    def is_alive(self) -> bool:
        if self.last_words is not None:
            conn, result = self.last_words
            send(conn, result)
            self.last_words = None
        return False

    def kill(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


class OneShotPool(ProcessPool):
    def __init__(self) -> None:
        runner = ProcessRunner(ChildConfig("sqlite:///unused.db", {}))
        super().__init__(1, runner, 0, start_method="spawn", max_tasks_per_child=1)
        self.launched: list[Any] = []

    def _launch(self) -> tuple[Any, Any]:
        ours, theirs = multiprocessing.Pipe()
        process = AnswersThenExits()
        self.launched.append((process, theirs))
        return process, ours


def test_a_result_sent_just_before_exiting_is_a_result_not_a_crash() -> None:
    pool = OneShotPool()
    pool.start()
    [child] = pool._children
    child.ready = True
    task = Task("job", 1, 1, 1, 0, app.handle, app.Item)
    pool.submit(task)
    process, theirs = pool.launched[0]
    process.last_words = (theirs, Result(task.key, ResultKind.FINISHED))

    [result] = pool.collect()
    assert (result.task_key, result.kind) == (task.key, ResultKind.FINISHED)


def test_a_rehearsal_changes_no_record(rig: Rig) -> None:
    # Spawn's template (and, on PostgreSQL, each new process) runs an invocation's
    # statements under a token no claim has, to warm caches: every record, of every
    # status, must come out of it as it went in.
    coordinator = rig.coordinator("spawn")
    ids = rig.add("finish", "unfinished;finish", "hang", "raise")
    table = coordinator.workers[app.WORKER].execution_table
    with rig.engine.begin() as conn:
        # The working record holds token 1, the first claim's: the most common token.
        phases = [Phase.PENDING, Phase.UNFINISHED, Phase.WORKING, Phase.FAILED]
        tokens = [0, 2, 1, 3]
        for item_id, phase, token in zip(ids, phases, tokens, strict=True):
            conn.execute(
                table.insert().values(
                    source_id=item_id,
                    status=phase.value,
                    token=token,
                    attempts=1,
                    failures=0,
                    crashes=0,
                    discovered_at=0.0,
                    updated_at=0.0,
                )
            )
    before = _rows(rig, table)
    runtime = Runtime(ChildConfig(rig.url, {}))
    try:
        for item_id in ids:
            runtime.rehearse(app.WORKER, app.Item, item_id)
    finally:
        runtime.dispose()
    assert _rows(rig, table) == before
    assert rig.effects() == []


def _rows(rig: Rig, table: Any) -> list[Any]:
    with rig.engine.connect() as conn:
        return list(conn.execute(select(table).order_by(table.c.source_id)).all())
