"""Executors that run several handlers at once in each process: sync handlers on
threads (``Threads``), ``async def`` handlers as tasks of one event loop (``AsyncIO``).

For I/O-bound handlers (they mostly wait: HTTP calls, other services) a process per
handler costs memory and start-up for nothing. Here a few processes (one by default)
share the worker's ``concurrency``: each has room for its share, gets tasks over its
pipe while it has room (and, once invocations are timed, the tasks claimed ahead for
its share, which start there as its slots free), and sends each result as that task
ends (``multiplexed_child``).

Every guarantee of the process executors holds, because the runner records each
invocation under its token in the handler's own transaction exactly as it does there:

- A process that dies takes every task in flight in it: each is reported CRASHED (the
  coordinator releases it, to run again), and none can commit any more.
- A task withdrawn by the coordinator (its timeout, a lost claim, a stop's deadline)
  has its ending written by the coordinator, fenced by its token, so whatever the
  handler commits afterwards fails its fence and rolls back. On the event loop the
  task is cancelled (its connection discarded). A thread cannot be stopped: its slot
  stays taken until it returns, its process gets no new tasks, and once only withdrawn
  tasks are left in it (or, on the event loop, their cancels went unanswered for
  ``CANCEL_GRACE_SECONDS``: a handler blocking the loop) the process is killed and
  replaced. Nothing else in flight is ever killed with it.
- A handler that blocks the event loop is reported (a log warning and the executor's
  ``loop_lags``, which the scheduler turns into ``loop_lag`` events).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from ..core.tasks import Result, ResultKind, Task, TaskKey, task_message, task_payload
from ..core.timing import AHEAD_PER_SLOT
from .base import ConcurrentRunner, Executor
from .children import Child, Children, ProcessHandle, start_process
from .interpreter import start_handler
from .multiplexed_child import (
    AHEAD,
    CANCELLED,
    LOOP_LAG,
    STARTED,
    TOGETHER,
    asyncio_main,
    threads_main,
)
from .process import CANCEL, READY, describe_exit, send

log = logging.getLogger("dbworker")

#: How long a cancelled task on an event loop may take to end before its process
#: (with nothing else of value in flight) is killed.
CANCEL_GRACE_SECONDS = 1.0
#: Claiming ahead: tasks may wait for a free slot while, at the pace recent invocations
#: ended, they would start within this long (at most AHEAD_PER_SLOT). They wait in the
#: process whose share they were sent for, so a slot that frees starts its next
#: handler at once, instead of after the result's trip to the scheduler and back, or a
#: claim's transaction (in benchmarks.io, 300 waits of 0.3 s at concurrency 50, each
#: wave started that much late). Nothing is claimed ahead before an invocation has
#: ended (they may be long). One second, not half: an invocation is timed from its
#: load to its commit, and there a wait of 0.3 s measured 0.45-0.75 s on a busy machine
#: (a cold warm-up, or its share of each wave's commits), which at 0.5 s claimed only
#: 34 of the next wave's 50 ahead: the other 16 slots waited ~110-150 ms for results to
#: reach the scheduler and a claim to come back.
CLAIM_AHEAD_SECONDS = 1.0


def shares(total: int, processes: int) -> list[int]:
    """``total`` slots split as evenly as possible over ``processes`` (at most one
    process per slot)."""
    count = max(1, min(processes, total))
    return [total // count + (1 if i < total % count else 0) for i in range(count)]


class MultiplexedPool(Executor):
    """``processes`` processes sharing ``slots``; ``asyncio``: tasks of an event loop,
    else threads. ``driver``: the asyncio driver (None: the backend's default);
    ``lag_warning``: the loop lag, in seconds, that is reported; ``loop``: the event
    loop ("asyncio" or "uvloop")."""

    #: A wave claimed while the worker is quiet starts with the rows read with its
    #: claim: the process's own read of them was 3.8-5.8 ms of the first wave's start
    #: (``benchmarks.io``). Tasks claimed ahead are read on arrival instead.
    uses_rows = True

    def __init__(
        self,
        slots: int,
        runner: ConcurrentRunner,
        parent_pid: int,
        processes: int = 1,
        *,
        asyncio: bool = False,
        start_method: str | None = None,
        driver: str | None = None,
        lag_warning: float = 0.25,
        loop: str = "asyncio",
    ) -> None:
        super().__init__(slots, runner, parent_pid)
        #: None: the process is the coordinator's own child, with no fork server or
        #: resource tracker beside it (``interpreter.py``).
        self._context: Any = (
            None if start_method is None else multiprocessing.get_context(start_method)
        )
        self.asyncio = asyncio
        self.driver = driver
        self.lag_warning = lag_warning
        self.loop = loop
        self._shares = shares(slots, processes)
        self._lifecycle = Children(self._launch, self._ready, lambda child: None)
        self._children: list[Child] = self._lifecycle.members
        #: Each child's room, by identity (children are replaced in place).
        self._room: dict[int, int] = {}
        self._next_share = 0
        #: Tasks submitted while no process had room (they start as soon as one has).
        self._waiting: collections.deque[Task] = collections.deque()
        #: When each task known to run started (tasks sent ahead: once reported).
        self._started: dict[TaskKey, float] = {}
        #: Tasks sent ahead to a process and not reported started there.
        self._queued: set[TaskKey] = set()
        #: How many of ``_queued`` each process holds, by identity: asked on every pass
        #: and for every task sent (a scan of a process's tasks each time was a fifth of
        #: the coordinator's CPU at concurrency 50, and grows with it).
        self._queued_in: collections.Counter[int] = collections.Counter()
        #: Withdrawn tasks still in a process, and when each was withdrawn: no result is
        #: reported for them, but they hold their slots until they end.
        self._withdrawn: dict[TaskKey, float] = {}
        self._payloads: dict[str, bytes] = {}
        #: Event-loop lags (seconds) reported since the scheduler last took them.
        self._lags: list[float] = []
        #: Recent invocations' duration (exponentially weighted); None until one ends.
        self._typical: float | None = None

    # -- processes ---------------------------------------------------------------------

    def start(self) -> None:
        self._lifecycle.start(len(self._shares))

    def _launch(self) -> tuple[ProcessHandle, Connection]:
        share = self._shares[self._next_share % len(self._shares)]
        self._next_share += 1
        if self.asyncio:
            target: Any = asyncio_main
            args: tuple[Any, ...] = (share, self.driver, self.lag_warning, self.loop)
        else:
            target, args = threads_main, (share,)
        if self._context is None:
            process, conn = start_handler(
                target, "dbworker-handler", self.runner, self.parent_pid, *args
            )
        else:
            process, conn = start_process(
                self._context, target, "dbworker-handler", self.runner, self.parent_pid, *args
            )
        self._room[id(conn)] = share
        return process, conn

    def _ready(self, child: Child, message: Any) -> bool:
        return bool(message == READY)

    def _room_of(self, child: Child) -> int:
        return self._room.get(id(child.conn), 0)

    def _takes_work(self, child: Child) -> bool:
        # A process holding a withdrawn task gets nothing new: it is on its way out.
        # (Asked on every pass of the scheduler's loop: no scan of its tasks while
        # nothing is withdrawn, the usual case.)
        withdrawn = self._withdrawn
        return child.usable and not (withdrawn and any(t.key in withdrawn for t in child.tasks))

    # -- dispatch ----------------------------------------------------------------------

    def free_slots(self) -> int:
        taking = [c for c in self._children if self._takes_work(c)]
        idle = sum(self._room_of(c) - self._busy(c) for c in taking) - len(self._waiting)
        ahead = self._ahead(sum(self._room_of(c) for c in taking))
        if idle > 0:
            # A slot has nothing to start: claim for the idle slots alone, and ahead in
            # the scheduler's next pass (it comes at once after a claim). Claimed
            # together, a wave after a quiet spell waited for the claim, the dispatch
            # and the reads of two waves ahead besides its own (``benchmarks.io``).
            return idle
        # Every slot is busy: top up the tasks claimed ahead, half their room at a time
        # (one claim's transaction for many tasks).
        free = ahead + idle
        return free if free > 0 and free * 2 >= ahead else 0

    def _ahead(self, slots: int) -> int:
        """How many tasks may wait for a slot (see CLAIM_AHEAD_SECONDS)."""
        typical = self._typical
        if typical is None:
            return 0
        return min(AHEAD_PER_SLOT * slots, int(slots * CLAIM_AHEAD_SECONDS / max(typical, 1e-6)))

    def submit(self, task: Task) -> None:
        self.submit_all((task,))

    def submit_all(self, tasks: Sequence[Task]) -> None:
        for task in tasks:
            if task.worker not in self._payloads:
                self._payloads[task.worker] = task_payload(task)
            self._waiting.append(task)
        self._dispatch()

    def _dispatch(self) -> None:
        # Free slots first (those tasks start at once), then each process's share of
        # the tasks claimed ahead. What a process is sent goes in one write: sent one by
        # one, a wave's 50 tasks reached a threads process over 25-50 ms, each read
        # while the threads started by the ones before held the GIL, and their rows
        # were read a few at a time.
        outgoing: dict[int, tuple[Child, list[Any]]] = {}
        for ahead in (False, True):
            for child in self._children:
                if not self._waiting or not self._takes_work(child):
                    continue
                room = self._room_of(child)
                limit = room + self._ahead(room) if ahead else room
                busy = self._busy(child)
                while self._waiting and busy < limit:
                    message = self._message(child, self._waiting.popleft(), room)
                    outgoing.setdefault(id(child), (child, []))[1].append(message)
                    busy += 1  # a task sent holds a slot or waits for one
        for child, messages in outgoing.values():
            # If the child is dead, collect() reports the crash for these tasks.
            with contextlib.suppress(OSError, EOFError):
                send(child.conn, messages[0] if len(messages) == 1 else (TOGETHER, messages))

    def _busy(self, child: Child) -> int:
        """``child``'s tasks that hold a slot or wait for one. An event loop's process
        starts a task sent ahead as soon as a handler returns, while that one's ending
        still commits: tasks reported started beyond its room are such endings, which
        hold no slot (counted, they kept the next wave's tasks from being claimed
        ahead until those endings' results came back)."""
        waiting = self._queued_in[id(child)]
        started = len(child.tasks) - waiting
        return min(started, self._room_of(child)) + waiting

    def _unqueue(self, child: Child, key: TaskKey) -> None:
        """``key``, of ``child``'s tasks, no longer waits there (started, or gone)."""
        if key in self._queued:
            self._queued.discard(key)
            self._queued_in[id(child)] -= 1

    def _message(self, child: Child, task: Task, room: int) -> Any:
        """``task``, now ``child``'s, as the message that sends it there. Sent ahead
        unless it surely finds a slot free: while tasks sent ahead are not reported
        started, the process may be running more than we know."""
        ahead = len(child.tasks) >= room or self._queued_in[id(child)] > 0
        child.tasks.append(task)
        message: Any = task_message(task, self._payloads[task.worker])
        if ahead:
            self._queued.add(task.key)
            self._queued_in[id(child)] += 1
            message = (AHEAD, message)
        else:
            self._started[task.key] = time.monotonic()
        return message

    # -- results -----------------------------------------------------------------------

    def wait_handles(self) -> Sequence[Any]:
        handles: list[Any] = []
        for child in self._children:
            if child.respawn_at is not None:
                continue
            if child.process.sentinel is not None:
                handles.append(child.process.sentinel)
            handles.append(child.conn)
        return handles

    def collect_by(self) -> float | None:
        # A withdrawn task on an event loop has until then to end (see _recycle).
        now = time.monotonic()
        due = [
            withdrawn + CANCEL_GRACE_SECONDS
            for key, withdrawn in self._withdrawn.items()
            if key not in self._queued
        ]
        # Only ahead: once passed, _recycle has had its look (a loop blocked by a
        # handler still in flight is not killed, and must not make the scheduler spin).
        return min((t for t in due if t > now), default=None)

    def collect(self) -> list[Result]:
        self._lifecycle.reap()
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
            self._lifecycle.check_ready(child)
            return
        while True:
            message = child.receive()
            if message is None:
                break
            self._read(child, message, results)
        if not child.alive():
            # A result sent just before the process exited is in the pipe by now.
            while (message := child.receive()) is not None:
                self._read(child, message, results)
            self._crashed(index, results)
            return
        self._recycle(index)

    def _read(self, child: Child, message: Any, results: list[Result]) -> None:
        if isinstance(message, Result):
            self._ended(child, message.task_key, message, results)
        elif isinstance(message, tuple) and message and message[0] == STARTED:
            _, keys, ended = message
            if ended is not None:
                self._read(child, ended, results)
            now = time.monotonic()
            for key in keys:
                self._unqueue(child, key)
                self._started[key] = now
        elif isinstance(message, tuple) and message and message[0] == CANCELLED:
            self._ended(child, message[1], None, results)
        elif isinstance(message, tuple) and message and message[0] == TOGETHER:
            for each in message[1]:
                self._read(child, each, results)
        elif isinstance(message, tuple) and message and message[0] == LOOP_LAG:
            self._lagged(message[1], message[2])

    def _ended(
        self, child: Child, key: TaskKey, result: Result | None, results: list[Result]
    ) -> None:
        self._end(child, key)
        if self._withdrawn.pop(key, None) is None and result is not None:
            results.append(result)
            if result.duration is not None:
                typical = self._typical
                duration = result.duration
                self._typical = duration if typical is None else 0.8 * typical + 0.2 * duration

    def _end(self, child: Child, key: TaskKey) -> None:
        self._started.pop(key, None)
        self._unqueue(child, key)
        for task in child.tasks:
            if task.key == key:
                child.tasks.remove(task)
                break
        child.completed += 1
        child.last_done = time.monotonic()

    def _lagged(self, seconds: float, running: int) -> None:
        self._lags.append(seconds)
        log.warning(
            "dbworker: a handler blocked the event loop for %.3fs (%d handlers in flight "
            "waited meanwhile): an async def handler must await its I/O; run blocking "
            'calls with asyncio.to_thread, or use executor="threads"',
            seconds,
            running,
        )

    def loop_lags(self) -> list[float]:
        lags, self._lags = self._lags, []
        return lags

    def _crashed(self, index: int, results: list[Result]) -> None:
        """The process at ``index`` died: every task running in it crashed; those
        waiting there go to the others."""
        child = self._children[index]
        child.process.join()
        now = time.monotonic()
        for task in self._take_tasks(child):
            started = self._started.pop(task.key, now)
            results.append(
                Result(
                    task.key,
                    ResultKind.CRASHED,
                    error=describe_exit(child.process.exitcode),
                    error_type="dbworker.WorkerCrashed",
                    exitcode=child.process.exitcode,
                    duration=now - started,
                )
            )
        self._replace(index)

    def _take_tasks(self, child: Child) -> list[Task]:
        """Empty a process that is gone: the tasks that were running in it, save those
        withdrawn (their endings were written then); those it had not started (as far
        as anyone knows: a start on its way counts as none) are submitted again."""
        running: list[Task] = []
        again: list[Task] = []
        for task in child.tasks:
            withdrawn = self._withdrawn.pop(task.key, None) is not None
            if task.key in self._queued:
                self._unqueue(child, task.key)
                if not withdrawn:
                    again.append(task)
            elif not withdrawn:
                running.append(task)
            else:
                self._started.pop(task.key, None)
        child.tasks.clear()
        self._queued_in.pop(id(child), None)
        self._waiting.extendleft(reversed(again))
        return running

    def _recycle(self, index: int) -> None:
        """Kill and replace a process in which only withdrawn tasks run (threads that
        cannot be stopped, or cancels the event loop has not answered in time); the
        tasks it had not started go to the others."""
        if not self._withdrawn:
            return  # the usual case, asked after every collect: nothing to scan
        child = self._children[index]
        running = [t for t in child.tasks if t.key not in self._queued]
        withdrawn = [self._withdrawn.get(t.key) for t in running]
        if not withdrawn or None in withdrawn:
            return
        if self.asyncio and time.monotonic() < min(w for w in withdrawn if w is not None) + (
            CANCEL_GRACE_SECONDS
        ):
            return
        child.process.kill()
        child.process.join()
        self._take_tasks(child)
        self._replace(index)

    def _replace(self, index: int) -> None:
        old = self._children[index]
        share = self._room.pop(id(old.conn), self._shares[index % len(self._shares)])
        self._next_share = index  # the successor takes the same share
        self._lifecycle.replace(index)
        self._room[id(self._children[index].conn)] = share

    # -- withdrawing -------------------------------------------------------------------

    def kill(self, task_key: TaskKey) -> bool:
        for task in self._waiting:
            if task.key == task_key:
                self._waiting.remove(task)
                return True
        for index, child in enumerate(self._children):
            if any(task.key == task_key for task in child.tasks):
                if task_key in self._withdrawn:
                    return True
                self._withdrawn[task_key] = time.monotonic()
                with contextlib.suppress(OSError):
                    send(child.conn, (CANCEL, task_key))
                if not self.asyncio:
                    self._recycle(index)
                return True
        return False

    def started(self, task_key: TaskKey) -> float | None:
        if task_key in self._withdrawn:
            return None
        return self._started.get(task_key)

    def shutdown(self) -> None:
        self._waiting.clear()
        self._lifecycle.shutdown()
