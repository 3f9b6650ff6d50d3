"""The inline executor: handlers run in threads of the coordinator's own process.

For tests and debugging (breakpoints work, no pickling). It cannot kill a
handler: a timeout or a lost claim is logged but the thread runs on, and a
handler that crashes the process takes the coordinator with it.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..core.tasks import Result, ResultKind, Task, TaskKey, describe
from .base import Executor, Runner


class InlineExecutor(Executor):
    def __init__(self, slots: int, runner: Runner, parent_pid: int) -> None:
        super().__init__(slots, runner, parent_pid)
        self._threads: ThreadPoolExecutor | None = None
        self._results: queue.SimpleQueue[Result] = queue.SimpleQueue()
        #: Running tasks and when they started.
        self._running: dict[TaskKey, tuple[Task, float]] = {}
        self._lock = threading.Lock()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)

    def start(self) -> None:
        self._threads = ThreadPoolExecutor(self.slots, thread_name_prefix="dbworker-inline")

    def free_slots(self) -> int:
        with self._lock:
            return self.slots - len(self._running)

    def submit(self, task: Task) -> None:
        assert self._threads is not None, "start() first"
        with self._lock:
            self._running[task.key] = (task, time.monotonic())
        future = self._threads.submit(self.runner.run, task)
        future.add_done_callback(lambda done: self._done(task, done))

    def _done(self, task: Task, future: Future[Result]) -> None:
        try:
            result = future.result()
        except BaseException as exc:  # a bug in the runtime; record it as the item's failure
            info = describe(exc)
            result = Result(
                task.key, ResultKind.UNRECORDED, info.message, info.type, info.traceback
            )
        self._results.put(result)
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")

    def wait_handles(self) -> Sequence[Any]:
        return [self._wake_read]

    def collect(self) -> list[Result]:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_read.recv(4096):
                pass
        results: list[Result] = []
        while True:
            try:
                result = self._results.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                self._running.pop(result.task_key, None)
            results.append(result)
        return results

    def kill(self, task_key: TaskKey) -> bool:
        return False  # threads cannot be killed; see the module docstring

    def started(self, task_key: TaskKey) -> float | None:
        with self._lock:
            running = self._running.get(task_key)
        return None if running is None else running[1]

    def shutdown(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
        self.runner.dispose()
        self._wake_read.close()
        self._wake_write.close()
