"""The default executor: a persistent pool of handler processes.

Each child runs one handler at a time and talks to the coordinator over its own
pipe, so a child's death touches only the item it was running: the coordinator
sees the pipe close or the process sentinel fire, releases that one claim, and
the pool starts a replacement. Children are started with forkserver (or spawn),
never a plain fork of the threaded coordinator.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

from ..core.tasks import Result, ResultKind, Task, TaskKey, task_message, task_payload
from .base import Executor, Runner
from .process import READY, child_main, describe_exit

#: How long shutdown waits for an idle child to exit before killing it.
EXIT_GRACE_SECONDS = 5.0
#: A child that dies before it is ready is replaced after this long, doubling while
#: its replacements die too: a broken interpreter or environment must not spin.
STARTUP_RETRY_SECONDS = 0.5
STARTUP_RETRY_MAX_SECONDS = 30.0

log = logging.getLogger("dbworker")


def default_start_method() -> str:
    # forkserver forks from a clean single-threaded server (cheap, and safe from
    # the coordinator's threads); spawn is the portable fallback.
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


class ProcessHandle(Protocol):
    """The part of multiprocessing's Process the pool uses; subprocesses adapt to it."""

    @property
    def exitcode(self) -> int | None: ...

    @property
    def sentinel(self) -> Any: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


@dataclass(slots=True)
class _Child:
    process: ProcessHandle
    conn: Connection
    task: Task | None = None
    started: float = 0.0
    completed: int = 0
    #: Whether it said READY. Only a ready child gets work: a claim made for a child
    #: still starting (seconds, for a new interpreter) would spend its lease, and its
    #: timeout, waiting for the handler to start.
    ready: bool = False
    #: Set when it died before it was ready: when to start its replacement.
    respawn_at: float | None = None

    @property
    def idle(self) -> bool:
        return self.task is None and self.ready and self.respawn_at is None


class ProcessPool(Executor):
    def __init__(
        self,
        slots: int,
        runner: Runner,
        parent_pid: int,
        start_method: str | None = None,
        max_tasks_per_child: int | None = None,
        spares: int = 0,
    ) -> None:
        super().__init__(slots, runner, parent_pid)
        # Choices are validated where users make them (strategies.py).
        self._context: Any = multiprocessing.get_context(start_method or default_start_method())
        self.max_tasks_per_child = max_tasks_per_child
        #: Processes kept started and ready beyond ``slots``: with few tasks per
        #: process, a ready one is waiting when a task ends, instead of a start.
        self.spares = spares
        self._children: list[_Child] = []
        #: Recycled children on their way out, with the time to stop waiting for them.
        self._retiring: list[tuple[ProcessHandle, float]] = []
        self._payloads: dict[str, bytes] = {}
        #: Children in a row that died before they were ready.
        self._startup_failures = 0

    def start(self) -> None:
        while len(self._children) < self.slots + self.spares:
            self._children.append(self._spawn())

    def _spawn(self) -> _Child:
        process, conn = self._launch()
        return _Child(process, conn)

    def _launch(self) -> tuple[ProcessHandle, Connection]:
        parent_end, child_end = self._context.Pipe()
        # Not daemonic: a daemonic process may not start processes of its own,
        # and handlers are free to. Shutdown and the parent watch end them instead.
        process = self._context.Process(
            target=child_main,
            args=(child_end, self.runner, self.parent_pid),
            name="dbworker-handler",
        )
        process.start()
        child_end.close()
        return process, parent_end

    def free_slots(self) -> int:
        idle = sum(1 for child in self._children if child.idle)
        busy = sum(1 for child in self._children if child.task is not None)
        return min(idle, self.slots - busy)

    def submit(self, task: Task) -> None:
        child = next(c for c in self._children if c.idle)
        payload = self._payloads.get(task.worker)
        if payload is None:
            payload = self._payloads[task.worker] = task_payload(task)
        child.task, child.started = task, time.monotonic()
        # If the child is dead, collect() reports the crash for this task.
        with contextlib.suppress(OSError, EOFError):
            child.conn.send(task_message(task, payload))

    def wait_handles(self) -> Sequence[Any]:
        handles: list[Any] = []
        for child in self._children:
            if child.respawn_at is not None:
                continue  # dead: its sentinel would wake the loop for ever
            if child.process.sentinel is not None:  # None: no pidfd (yet) to watch
                handles.append(child.process.sentinel)
            if child.task is not None or not child.ready:
                handles.append(child.conn)
        return handles

    def collect(self) -> list[Result]:
        self._reap()
        results: list[Result] = []
        for index, child in enumerate(self._children):
            if child.respawn_at is not None:
                if time.monotonic() >= child.respawn_at:
                    self._replace(index)
                continue
            if not child.ready:
                self._check_ready(child)
                continue
            if child.task is None:
                if not child.process.is_alive():
                    self._replace(index)
                continue
            result = self._receive(child)
            alive = result is not None or child.process.is_alive()
            if not alive:
                # A result sent just before the process exited is in the pipe by the
                # time its death shows: look once more before calling it a crash.
                result = self._receive(child)
            if result is not None:
                results.append(result)
                child.task = None
                child.completed += 1
                if self.max_tasks_per_child and child.completed >= self.max_tasks_per_child:
                    self._retire(index)
                continue
            if not alive:
                task = child.task
                child.process.join()
                results.append(
                    Result(
                        task.key,
                        ResultKind.CRASHED,
                        error=describe_exit(child.process.exitcode),
                        error_type="dbworker.WorkerCrashed",
                        exitcode=child.process.exitcode,
                        duration=time.monotonic() - child.started,
                    )
                )
                self._replace(index)
        return results

    def _check_ready(self, child: _Child) -> None:
        try:
            if child.conn.poll() and self._ready_message(child, child.conn.recv()):
                child.ready = True
                self._startup_failures = 0
                return
        except (EOFError, OSError):
            self._closed_before_ready(child)
        if child.process.is_alive():
            return
        child.process.join()
        self._startup_failures += 1
        delay = min(
            STARTUP_RETRY_SECONDS * 2 ** (self._startup_failures - 1), STARTUP_RETRY_MAX_SECONDS
        )
        child.respawn_at = time.monotonic() + delay
        log.error(
            "dbworker: a handler process exited before it was ready (%s); starting another "
            "in %.1fs",
            describe_exit(child.process.exitcode),
            delay,
        )

    def _ready_message(self, child: _Child, message: Any) -> bool:
        return bool(message == READY)

    def _closed_before_ready(self, child: _Child) -> None:
        """The child's end of the pipe closed before it said ready (it died starting)."""

    @staticmethod
    def _receive(child: _Child) -> Result | None:
        try:
            if child.conn.poll():
                result: Result = child.conn.recv()
                return result
        except (EOFError, OSError):
            pass
        return None

    def _retire(self, index: int) -> None:
        # Ask the child to exit and start its successor at once; waiting for the
        # exit here would hold up the scheduler's loop (every worker's results,
        # renewals and claims) for each recycled child: on every item under spawn.
        child = self._children[index]
        with contextlib.suppress(OSError):
            child.conn.send(None)
        child.conn.close()
        self._retiring.append((child.process, time.monotonic() + EXIT_GRACE_SECONDS))
        self._children[index] = self._spawn()

    def _reap(self) -> None:
        """Collect recycled children that have exited; kill those past their grace."""
        now = time.monotonic()
        still: list[tuple[ProcessHandle, float]] = []
        for process, deadline in self._retiring:
            if process.is_alive() and now < deadline:
                still.append((process, deadline))
                continue
            if process.is_alive():
                process.kill()
            process.join()
        self._retiring = still

    def _replace(self, index: int) -> None:
        old = self._children[index]
        old.conn.close()
        old.process.join(0)
        self._children[index] = self._spawn()

    def kill(self, task_key: TaskKey) -> bool:
        for index, child in enumerate(self._children):
            if child.task is not None and child.task.key == task_key:
                child.process.kill()
                child.process.join()
                self._replace(index)
                return True
        return False

    def running(self) -> list[Task]:
        return [child.task for child in self._children if child.task is not None]

    def shutdown(self) -> None:
        for child in self._children:
            with contextlib.suppress(OSError):
                if child.task is None:
                    child.conn.send(None)
                else:
                    child.process.kill()
        deadline = time.monotonic() + EXIT_GRACE_SECONDS
        for child in self._children:
            child.process.join(max(0.0, deadline - time.monotonic()))
            if child.process.is_alive():
                child.process.kill()
                child.process.join()
            child.conn.close()
        self._children.clear()
        for process, _ in self._retiring:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        self._retiring.clear()
