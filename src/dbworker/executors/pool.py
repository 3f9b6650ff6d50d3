"""The default executor: a persistent pool of handler processes.

Each child runs one handler at a time and talks to the coordinator over its own
pipe, so a child's death touches only the item it was running: the coordinator
sees the pipe close or the process sentinel fire, releases that one claim, and
the pool starts a replacement. Children are started with forkserver (or spawn),
never a plain fork of the threaded coordinator.

This module dispatches: it queues claimed tasks, hands them to processes, reads
their results and requeues what a lost process had not started. The processes'
lifecycle is ``children.py``'s; how many tasks may wait for each, ``prefetch.py``'s.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from ..core.tasks import Result, ResultKind, Task, TaskKey, task_message, task_payload
from .base import Executor, Runner
from .children import (
    Child,
    Children,
    Exits,
    ProcessHandle,
    default_start_method,
    forked,
    start_process,
)
from .prefetch import PrefetchPolicy, streaming
from .process import BATCH, CANCEL, READY, SKIPPED, child_main, describe_exit, send


class ProcessPool(Executor):
    """Persistent processes, each running its tasks one after another.

    With ``prefetch``, up to that many claimed tasks per process wait for it while
    recent invocations are short (their expected wait stays under
    ``PREFETCH_HORIZON_SECONDS``): the scheduler then claims in batches and a process
    never idles while the coordinator claims. One of them waits in the process's own
    pipe, so it starts the moment the one before it ends; the others wait here and go
    to whichever process frees first.
    """

    uses_rows = True

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
        #: The processes started with the pool fork from the coordinator while it runs a
        #: single thread (``children.forked``): they share its memory, and the fork
        #: server and resource tracker start only if a process is ever replaced (by
        #: then the coordinator runs threads, which a fork would copy mid-operation).
        #: Not when the user chose a start method, nor for a pool that recycles its
        #: processes, whose many starts the fork server makes cheap.
        self._fork_first = start_method is None and max_tasks_per_child is None and not spares
        #: Processes kept started and ready beyond ``slots``: with few tasks per
        #: process, a ready one is waiting when a task ends, instead of a start.
        self.spares = spares
        #: At most this many tasks wait per process (a process that runs one task in
        #: all has none waiting).
        self.prefetch = 0 if max_tasks_per_child == 1 else prefetch
        # The loops below read it into a local first: a slotted object's methods then
        # cost no more than the pool's own.
        self._policy = PrefetchPolicy(self.prefetch)
        self._lifecycle = Children(self._launch, self._ready_message, self._closed_before_ready)
        #: The lifecycle's list itself (it replaces children in place): the loops
        #: below index it directly.
        self._children: list[Child] = self._lifecycle.members
        #: Submitted tasks no process has been sent yet, in claim order.
        self._waiting: collections.deque[Task] = collections.deque()
        #: Tasks that were killed while waiting in a process's pipe: that process is
        #: stopped when it gets to one.
        self._cancelled: set[TaskKey] = set()
        self._payloads: dict[str, bytes] = {}
        #: Tasks sent to a process that may run them in a group (several in one
        #: transaction, ``executors/process.run_next``) and have not come back.
        self._grouped: set[TaskKey] = set()
        #: Tasks of a group whose process died: each is sent to run alone, so that a
        #: crash is charged to the item that caused it.
        self._alone: set[TaskKey] = set()

    def start(self) -> None:
        self._lifecycle.start(self.slots + self.spares)

    # -- hooks: how a process starts and says it is ready ----------------------------

    def _launch(self) -> tuple[ProcessHandle, Connection]:
        if self._fork_first:
            started = forked(
                child_main, "dbworker-handler", self.runner, self.parent_pid, prepared=True
            )
            if started is not None:
                return started
            self._fork_first = False  # the coordinator runs threads now
        return start_process(
            self._context, child_main, "dbworker-handler", self.runner, self.parent_pid
        )

    def _ready_message(self, child: Child, message: Any) -> bool:
        return bool(message == READY)

    def _closed_before_ready(self, child: Child) -> None:
        """The child's end of the pipe closed before it said ready (it died starting)."""

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

    def _takes_more(self, child: Child, now: float, pipe_depth: int) -> bool:
        """Whether ``child``'s pipe takes another task (``pipe_depth``: the policy's,
        read once per dispatch)."""
        if not child.usable or len(child.tasks) >= pipe_depth:
            return False
        if child.tasks and not streaming(child, now):
            return False  # it may run long: the task goes to whichever process frees first
        limit = self.max_tasks_per_child
        return limit is None or child.completed + len(child.tasks) < limit

    def _dispatch(self) -> None:
        """Send waiting tasks to processes with room in their pipes, idle ones first:
        each process's share in one message."""
        if not self._waiting:
            return
        now = time.monotonic()
        pipe_depth = self._policy.pipe_depth
        ready = [c for c in self._children if self._takes_more(c, now, pipe_depth)]
        sent: dict[int, list[Task]] = {}
        while self._waiting and ready:
            child = min(ready, key=lambda c: len(c.tasks))
            task = self._waiting.popleft()
            if not child.tasks:
                child.started = time.monotonic()
            child.tasks.append(task)
            sent.setdefault(id(child), []).append(task)
            if not self._takes_more(child, now, pipe_depth):
                ready.remove(child)
        if not sent:
            return
        groupable = self._policy.groupable
        for child in self._children:
            tasks = sent.get(id(child))
            if tasks:
                self._send(child, tasks, groupable)

    def _send(self, child: Child, tasks: list[Task], groupable: bool) -> None:
        """Send ``tasks`` to ``child`` (if it is dead, collect() reports the crash)."""
        payloads = self._payloads
        if groupable and any(task.alone or task.key in self._alone for task in tasks):
            # One has a timeout (a group's later items have no start of their own that
            # the pool could time), or crashed a group: they run alone.
            groupable = False
        if groupable:
            self._grouped.update(task.key for task in tasks)
        if len(tasks) == 1 and not groupable:
            message: Any = task_message(tasks[0], payloads[tasks[0].worker])
        else:
            messages = [task_message(task, payloads[task.worker]) for task in tasks]
            message = (BATCH, messages, groupable)
        with contextlib.suppress(OSError, EOFError):
            send(child.conn, message)

    def _requeue(self, tasks: Sequence[Task]) -> None:
        """Give tasks a dead or stopped process had not started to the others, first."""
        for task in reversed(tasks):
            self._grouped.discard(task.key)
            if task.key in self._cancelled:
                self._cancelled.discard(task.key)
            else:
                self._waiting.appendleft(task)

    # -- results -------------------------------------------------------------------

    def wait_handles(self) -> Sequence[Any]:
        handles: list[Any] = []
        now = time.monotonic()
        policy = self._policy
        for child in self._children:
            if child.respawn_at is not None:
                continue  # dead: its sentinel would wake the loop for ever
            if child.process.sentinel is not None:  # None: no pidfd (yet) to watch
                handles.append(child.process.sentinel)  # a death is seen at once
            if not child.ready or (child.tasks and policy.read_by(child) <= now):
                handles.append(child.conn)
        return handles

    def collect_by(self) -> float | None:
        # Children whose results are due have their pipes among the wait handles.
        now = time.monotonic()
        policy = self._policy
        times = [policy.read_by(c) for c in self._children if c.usable and c.tasks]
        return min((t for t in times if t > now), default=None)

    def collect(self) -> list[Result]:
        self._lifecycle.reap()
        results: list[Result] = []
        exits = Exits(self._children)
        for index in range(len(self._children)):
            self._collect_child(index, results, exits)
        self._dispatch()
        return results

    def _collect_child(self, index: int, results_out: list[Result], exits: Exits) -> None:
        child = self._children[index]
        if child.respawn_at is not None:
            if time.monotonic() >= child.respawn_at:
                self._lifecycle.replace(index)
            return
        if not child.ready:
            self._lifecycle.check_ready(child)
            return
        if not child.tasks:
            if not child.alive(exits):
                self._lifecycle.replace(index)
            return
        policy = self._policy
        while child.tasks:
            message = child.receive()
            alive = message is not None or child.alive(exits)
            if not alive:
                # A result sent just before the process exited is in the pipe by the
                # time its death shows: look once more before calling it a crash.
                message = child.receive()
            if message is None:
                if not alive:
                    self._crashed(index, results_out)
                return
            results, skipped = _unpack(message)
            now = time.monotonic()
            for result in results:
                task = child.tasks.popleft()
                child.completed += 1
                self._grouped.discard(task.key)
                self._alone.discard(task.key)
                policy.measured(result.duration, now)
                if task.key in self._cancelled:
                    # Withdrawn while it ran inside a group: the scheduler has its
                    # ending already (kill() reports none); its fenced writes decided.
                    self._cancelled.discard(task.key)
                else:
                    results_out.append(result)
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
                self._lifecycle.retire(index)
                return

    def _crashed(self, index: int, results: list[Result]) -> None:
        child = self._children[index]
        task, *rest = child.tasks
        child.tasks.clear()
        child.process.join()
        group = []
        for member in (task, *rest):
            if member.key not in self._grouped:
                break
            group.append(member)
        self._grouped.difference_update(t.key for t in (task, *rest))
        if len(group) > 1:
            # It may have died in a group: none of the group committed, and which of
            # them killed it is not known. All go to the others again, each to run
            # alone: the one that kills its process again is then charged with it.
            self._alone.update(member.key for member in group)
            self._requeue([task, *rest])
        elif task.key in self._cancelled:
            self._cancelled.discard(task.key)  # killed on purpose: no result for it
            self._requeue(rest)
        else:
            self._alone.discard(task.key)
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
        self._lifecycle.replace(index)

    def _stop_child(self, index: int) -> None:
        """Kill a process and hand the tasks it had not started to the others."""
        self._requeue(self._lifecycle.kill(index))
        self._lifecycle.replace(index)

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
        self._lifecycle.shutdown()


def _unpack(message: Any) -> tuple[Sequence[Result], Sequence[TaskKey]]:
    """A child's message as (results, keys of withdrawn tasks it skipped)."""
    if isinstance(message, tuple) and message and message[0] == SKIPPED:
        found: Any = message[2] if len(message) > 2 else []
        return (found if isinstance(found, list) else [found]), message[1]
    return (message if isinstance(message, list) else [message]), ()
