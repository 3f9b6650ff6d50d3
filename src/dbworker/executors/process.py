"""What every handler process an executor starts does, whatever started it: watch
its coordinator, say when it is ready, and answer task messages with results."""

from __future__ import annotations

import _thread
import collections
import contextlib
import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ..core.tasks import Result, Task, TaskKey, TaskMessage, task_from_message
from .base import Runner

#: How often a child checks that its coordinator is still alive.
PARENT_CHECK_SECONDS = 1.0
#: Exit status of a handler process that outlived its coordinator.
ORPHAN_EXIT_STATUS = 70
#: What a child sends once it can start a handler at once (imports done, connected).
READY = "ready"
#: (CANCEL, task key): withdraw a task sent ahead, if it has not started.
CANCEL = "cancel"
#: (SKIPPED, [task keys]) or (SKIPPED, [task keys], result): withdrawn tasks skipped.
#: ``result`` (there and alone) is a Result, or a list of a group's Results.
SKIPPED = "skipped"
#: (BATCH, [task messages], groupable): several tasks in one message; ``groupable``:
#: the process may run consecutive ones of a worker in one transaction (the runner's
#: ``run_group``), because recent invocations were short.
BATCH = "batch"


def send(conn: Connection, message: Any) -> None:
    """Send ``message`` to the other end of a handler process's pipe.

    Plain pickles, not ``Connection.send``: multiprocessing's pickler (which can also
    pass file descriptors, not needed here) costs more than the rest of sending a
    short task's result, and one crosses for every invocation.
    """
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    """The next message ``send`` sent over ``conn``."""
    return pickle.loads(conn.recv_bytes())


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "the handler process vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the handler process was killed by {name} (exit status {exitcode})"
    return f"the handler process exited with status {exitcode}"


def default_signals() -> None:
    """A process forked from the coordinator (``children.forked``) inherited the
    application's Python signal handlers: back to a new interpreter's defaults."""
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)


def watch_parent(parent_pid: int) -> None:
    """Exit this process when the coordinator ``parent_pid`` exits (from a thread)."""
    # A bare thread: threading.Thread's bookkeeping (and its wait for the thread
    # to start) is a tenth of a spawn-per-task process's start-up.
    _thread.start_new_thread(_watch_parent, (parent_pid,))


def _watch_parent(parent_pid: int) -> None:
    # An orphaned handler would keep running beside the coordinator that takes
    # its item over; its writes would be fenced off, but its side effects not.
    # The coordinator is not our parent under forkserver, so watch its pid: a
    # pidfd becomes readable when it exits; elsewhere, poll for its existence.
    try:
        pidfd = os.pidfd_open(parent_pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        select.select([pidfd], [], [])
        os._exit(ORPHAN_EXIT_STATUS)
    while True:
        time.sleep(PARENT_CHECK_SECONDS)
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(ORPHAN_EXIT_STATUS)
        except PermissionError:
            pass  # exists, owned by someone else: the pid was reused, but rarely so fast


def answer(runner: Runner, message: TaskMessage) -> Result:
    """The result of the task ``message`` carries."""
    task = task_from_message(message)
    return task if isinstance(task, Result) else runner.run(task)


def child_main(conn: Connection, runner: Runner, parent_pid: int) -> None:
    """A persistent handler process: warm up, say ready, answer tasks until told to stop."""
    default_signals()
    # Ctrl-C reaches the whole process group; the coordinator decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(parent_pid)
    try:
        runner.warm_up()
        send(conn, READY)
        with contextlib.suppress(EOFError, OSError):
            serve(conn, runner)
    finally:
        runner.dispose()


def serve(conn: Connection, runner: Runner) -> None:
    """Answer the tasks ``conn`` brings, in order, until it brings None.

    Several tasks may wait in the pipe (sent ahead). The coordinator can withdraw one
    that has not started (``(CANCEL, key)``): before starting a task this process reads
    everything that has arrived, so a withdrawn task is skipped rather than started,
    and says which it skipped with the next result (or alone, if it has none to send).
    Tasks that came as groupable may run as a group (``run_next``); the group's
    results then go back in one message, after its commit.
    """
    waiting: collections.deque[tuple[TaskMessage, bool]] = collections.deque()
    cancelled: set[TaskKey] = set()
    closing = False
    # Registered once: ``conn.poll()`` builds a selector for every look, twice an item.
    arrived = select.poll()
    arrived.register(conn.fileno(), select.POLLIN)

    def read(message: Any) -> bool:
        if message is None:
            return False
        if message[0] == CANCEL:
            cancelled.add(message[1])
        elif message[0] == BATCH:
            groupable = bool(message[2])
            waiting.extend((task, groupable) for task in message[1])
        else:
            waiting.append((message, False))
        return True

    def read_arrived() -> bool:
        nonlocal closing
        while not closing and arrived.poll(0):
            if not read(receive(conn)):
                closing = True
        return not closing

    def withdrawn(key: TaskKey) -> bool:
        """Asked by a group before each further task: whether to stop before it."""
        return not read_arrived() or key in cancelled

    def skip_withdrawn() -> list[TaskKey]:
        skipped = []
        while waiting and message_key(waiting[0][0]) in cancelled:
            key = message_key(waiting.popleft()[0])
            cancelled.discard(key)
            skipped.append(key)
        return skipped

    if not read(receive(conn)):
        return
    while True:
        if not read_arrived():
            return
        skipped = skip_withdrawn()
        if skipped:
            send(conn, (SKIPPED, skipped))
        if not waiting:
            if not read(receive(conn)):
                return
            continue
        result = run_next(runner, waiting, withdrawn)
        if not read_arrived():
            send(conn, result)
            return
        skipped = skip_withdrawn()
        # Sent with the result: when the coordinator reads it, it knows the next task
        # has started (or that there is none).
        send(conn, result if not skipped else (SKIPPED, skipped, result))
        if not waiting and not read(receive(conn)):
            return


def run_next(
    runner: Runner,
    waiting: collections.deque[tuple[TaskMessage, bool]],
    withdrawn: Callable[[TaskKey], bool],
) -> Result | list[Result]:
    """Run the first waiting task, alone or (when it and the next ones of its worker
    came groupable and the runner groups) as the head of a group; take what ran off
    ``waiting`` and return its result, or the group's results."""
    message, groupable = waiting[0]
    run_group = getattr(runner, "run_group", None)
    if run_group is None or not groupable or len(waiting) < 2:
        waiting.popleft()
        return answer(runner, message)
    worker = message[0][0]
    tasks: list[Task] = []
    for candidate, candidate_groupable in waiting:
        if not candidate_groupable or candidate[0][0] != worker:
            break
        task = task_from_message(candidate)
        if isinstance(task, Result):
            break  # its handler cannot be imported: it is answered alone
        tasks.append(task)
    if len(tasks) < 2:
        waiting.popleft()
        return answer(runner, message)
    results: list[Result] = run_group(tasks, withdrawn)
    for _ in results:
        waiting.popleft()
    return results


def message_key(message: TaskMessage) -> TaskKey:
    worker, source_id, token, _attempt, _failures, _row = message[0]
    return (worker, source_id, token)
