"""The default executor: a persistent pool of handler processes.

Each child runs one handler at a time and talks to the coordinator over its own
pipe, so a child's death touches only the item it was running: the coordinator
sees the pipe close or the process sentinel fire, releases that one claim, and
the pool starts a replacement. Children are started with forkserver (or spawn),
never a plain fork of the threaded coordinator.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import select
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from ..core.tasks import Result, ResultKind, Task, TaskKey, task_message, task_payload
from .base import Executor, Runner
from .prefetch import PrefetchPolicy, streaming
from .process import CANCEL, READY, SKIPPED, child_main, describe_exit, receive, send

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
    #: Tasks sent down its pipe, in order: the first is running, the rest wait there.
    tasks: collections.deque[Task] = field(default_factory=collections.deque)
    #: When the first of ``tasks`` started (as far as the coordinator can tell: when
    #: it was sent, or when the result before it arrived).
    started: float = 0.0
    #: When it last reported a result (or skipped withdrawn tasks).
    last_done: float = float("-inf")
    completed: int = 0
    #: Whether it said READY. Only a ready child gets work: a claim made for a child
    #: still starting (seconds, for a new interpreter) would spend its lease, and its
    #: timeout, waiting for the handler to start.
    ready: bool = False
    #: Set when it died before it was ready: when to start its replacement.
    respawn_at: float | None = None

    #: Readiness of its pipe, checked without building a selector each time (a
    #: pipe's ``poll()`` does), which is a large share of a short task's cost here.
    pipe: select.poll = field(default_factory=select.poll)

    def __post_init__(self) -> None:
        self.pipe.register(self.conn.fileno(), select.POLLIN)

    @property
    def usable(self) -> bool:
        return self.ready and self.respawn_at is None

    def readable(self) -> bool:
        return bool(self.pipe.poll(0))

    def alive(self) -> bool:
        """Whether the process runs (its sentinel, when it has one, says so cheaply)."""
        sentinel = self.process.sentinel
        if isinstance(sentinel, int):
            try:
                if not select.select([sentinel], [], [], 0)[0]:
                    return True
            except (OSError, ValueError):
                pass
        return bool(self.process.is_alive())


class ProcessPool(Executor):
    """Persistent processes, each running its tasks one after another.

    With ``prefetch``, up to that many claimed tasks per process wait for it while
    recent invocations are short (their expected wait stays under
    ``PREFETCH_HORIZON_SECONDS``): the scheduler then claims in batches and a process
    never idles while the coordinator claims. One of them waits in the process's own
    pipe, so it starts the moment the one before it ends; the others wait here and go
    to whichever process frees first.
    """

    def __init__(
        self,
        slots: int,
        runner: Runner,
        parent_pid: int,
        start_method: str | None = None,
        max_tasks_per_child: int | None = None,
        spares: int = 0,
        prefetch: int = 0,
    ) -> None:
        super().__init__(slots, runner, parent_pid)
        # Choices are validated where users make them (strategies.py).
        self._context: Any = multiprocessing.get_context(start_method or default_start_method())
        self.max_tasks_per_child = max_tasks_per_child
        #: Processes kept started and ready beyond ``slots``: with few tasks per
        #: process, a ready one is waiting when a task ends, instead of a start.
        self.spares = spares
        #: At most this many tasks wait per process (a process that runs one task in
        #: all has none waiting).
        self.prefetch = 0 if max_tasks_per_child == 1 else prefetch
        self._policy = PrefetchPolicy(self.prefetch)
        # Bound once: collect() and wait_handles() call them for every result and
        # process, as cheaply as methods of the pool's own.
        self._measured = self._policy.measured
        self._read_by = self._policy.read_by
        self._children: list[_Child] = []
        #: Submitted tasks no process has been sent yet, in claim order.
        self._waiting: collections.deque[Task] = collections.deque()
        #: Tasks that were killed while waiting in a process's pipe: that process is
        #: stopped when it gets to one.
        self._cancelled: set[TaskKey] = set()
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

    # -- dispatch ------------------------------------------------------------------

    def free_slots(self) -> int:
        return self._policy.free_slots(
            self._children, len(self._waiting), self.slots, time.monotonic()
        )

    def submit(self, task: Task) -> None:
        self.submit_all((task,))

    def submit_all(self, tasks: Sequence[Task]) -> None:
        # One dispatch for a claim's tasks: each finds the processes with room again.
        for task in tasks:
            if task.worker not in self._payloads:
                self._payloads[task.worker] = task_payload(task)
            self._waiting.append(task)
        self._dispatch()

    def _takes_more(self, child: _Child, now: float, pipe_depth: int) -> bool:
        """Whether ``child``'s pipe takes another task (``pipe_depth``: the policy's,
        read once per dispatch)."""
        if not child.usable or len(child.tasks) >= pipe_depth:
            return False
        if child.tasks and not streaming(child, now):
            return False  # it may run long: the task goes to whichever process frees first
        limit = self.max_tasks_per_child
        return limit is None or child.completed + len(child.tasks) < limit

    def _dispatch(self) -> None:
        """Send waiting tasks to processes with room in their pipes, idle ones first."""
        if not self._waiting:
            return
        now = time.monotonic()
        pipe_depth = self._policy.pipe_depth
        ready = [c for c in self._children if self._takes_more(c, now, pipe_depth)]
        while self._waiting and ready:
            child = min(ready, key=lambda c: len(c.tasks))
            task = self._waiting.popleft()
            if not child.tasks:
                child.started = time.monotonic()
            child.tasks.append(task)
            # If the child is dead, collect() reports the crash for this task.
            with contextlib.suppress(OSError, EOFError):
                send(child.conn, task_message(task, self._payloads[task.worker]))
            if not self._takes_more(child, now, pipe_depth):
                ready.remove(child)

    def _requeue(self, tasks: Sequence[Task]) -> None:
        """Give tasks a dead or stopped process had not started to the others, first."""
        for task in reversed(tasks):
            if task.key in self._cancelled:
                self._cancelled.discard(task.key)
            else:
                self._waiting.appendleft(task)

    # -- results -------------------------------------------------------------------

    def wait_handles(self) -> Sequence[Any]:
        handles: list[Any] = []
        now = time.monotonic()
        for child in self._children:
            if child.respawn_at is not None:
                continue  # dead: its sentinel would wake the loop for ever
            if child.process.sentinel is not None:  # None: no pidfd (yet) to watch
                handles.append(child.process.sentinel)  # a death is seen at once
            if not child.ready or (child.tasks and self._read_by(child) <= now):
                handles.append(child.conn)
        return handles

    def collect_by(self) -> float | None:
        # Children whose results are due have their pipes among the wait handles.
        now = time.monotonic()
        times = [self._read_by(c) for c in self._children if c.usable and c.tasks]
        return min((t for t in times if t > now), default=None)

    def collect(self) -> list[Result]:
        self._reap()
        results: list[Result] = []
        for index in range(len(self._children)):
            self._collect_child(index, results)
        self._dispatch()
        return results

    def _collect_child(self, index: int, results: list[Result]) -> None:
        child = self._children[index]
        if child.respawn_at is not None:
            if time.monotonic() >= child.respawn_at:
                self._replace(index)
            return
        if not child.ready:
            self._check_ready(child)
            return
        if not child.tasks:
            if not child.alive():
                self._replace(index)
            return
        while child.tasks:
            message = self._receive(child)
            alive = message is not None or child.alive()
            if not alive:
                # A result sent just before the process exited is in the pipe by the
                # time its death shows: look once more before calling it a crash.
                message = self._receive(child)
            if message is None:
                if not alive:
                    self._crashed(index, results)
                return
            result, skipped = _unpack(message)
            if result is not None:
                child.tasks.popleft()
                child.completed += 1
                results.append(result)
                self._measured(result.duration, time.monotonic())
            for key in skipped:  # withdrawn before they started: no result for them
                self._cancelled.discard(key)
                child.tasks = collections.deque(t for t in child.tasks if t.key != key)
            child.started = child.last_done = time.monotonic()  # the next one starts now
            if child.tasks and child.tasks[0].key in self._cancelled:
                # Withdrawn too late to be skipped: it is starting. Stop the process
                # before that handler gets far; the tasks after it go to the others.
                self._cancelled.discard(child.tasks[0].key)
                self._stop_child(index)
                return
            if self.max_tasks_per_child and child.completed >= self.max_tasks_per_child:
                self._retire(index)
                return

    def _crashed(self, index: int, results: list[Result]) -> None:
        child = self._children[index]
        task, *rest = child.tasks
        child.tasks.clear()
        child.process.join()
        if task.key in self._cancelled:
            self._cancelled.discard(task.key)  # killed on purpose: no result for it
        else:
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
        self._requeue(rest)
        self._replace(index)

    def _stop_child(self, index: int) -> None:
        """Kill a process and hand the tasks it had not started to the others."""
        child = self._children[index]
        child.process.kill()
        child.process.join()
        rest = list(child.tasks)[1:]
        child.tasks.clear()
        self._requeue(rest)
        self._replace(index)

    def _check_ready(self, child: _Child) -> None:
        try:
            if child.conn.poll() and self._ready_message(child, receive(child.conn)):
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
    def _receive(child: _Child) -> Any:
        try:
            if child.readable():
                return receive(child.conn)
        except (EOFError, OSError):
            pass
        return None

    def _retire(self, index: int) -> None:
        # Ask the child to exit and start its successor at once; waiting for the
        # exit here would hold up the scheduler's loop (every worker's results,
        # renewals and claims) for each recycled child: on every item under spawn.
        child = self._children[index]
        with contextlib.suppress(OSError):
            send(child.conn, None)
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
        for task in self._waiting:
            if task.key == task_key:
                self._waiting.remove(task)
                return True
        for index, child in enumerate(self._children):
            keys = [task.key for task in child.tasks]
            if task_key not in keys:
                continue
            if keys[0] == task_key:
                self._stop_child(index)
            else:
                # Waiting in the process's pipe: it skips the task when it gets to it
                # (or, if it has started it meanwhile, is stopped then).
                self._cancelled.add(task_key)
                with contextlib.suppress(OSError):
                    send(child.conn, (CANCEL, task_key))
            return True
        return False

    def started(self, task_key: TaskKey) -> float | None:
        for child in self._children:
            if child.tasks and child.tasks[0].key == task_key:
                return child.started
        return None

    def shutdown(self) -> None:
        self._waiting.clear()
        for child in self._children:
            with contextlib.suppress(OSError):
                if not child.tasks:
                    send(child.conn, None)
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


def _unpack(message: Any) -> tuple[Result | None, Sequence[TaskKey]]:
    """A child's message as (result, keys of withdrawn tasks it skipped)."""
    if isinstance(message, tuple) and message and message[0] == SKIPPED:
        return (message[2] if len(message) > 2 else None), message[1]
    return message, ()
