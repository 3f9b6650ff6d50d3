"""The pool reads a process's last result even when the process has exited since.

A spawn-per-task process sends its result and exits at once, so the coordinator
can see it dead before it has read the result. Found by the executors benchmark
(one item in a few hundred was reported as a crash with exit status 0); here the
race is made certain with a stand-in process that answers and exits as soon as the
pool checks whether it is alive.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from dbworker.executors import ChildConfig, Result, ResultKind, Task
from dbworker.executors.pool import ProcessPool

from . import app


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
            conn.send(result)
            self.last_words = None
        return False

    def kill(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


class OneShotPool(ProcessPool):
    def __init__(self) -> None:
        config = ChildConfig("sqlite:///unused.db", {}, 0)
        super().__init__(1, config, start_method="spawn", max_tasks_per_child=1)
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
