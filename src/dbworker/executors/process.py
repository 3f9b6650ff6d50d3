"""What every handler process an executor starts does, whatever started it: watch
its coordinator, say when it is ready, and answer task messages with results."""

from __future__ import annotations

import _thread
import os
import select
import signal
import time
from multiprocessing.connection import Connection

from ..core.tasks import Result, TaskMessage, task_from_message
from .base import Runner

#: How often a child checks that its coordinator is still alive.
PARENT_CHECK_SECONDS = 1.0
#: Exit status of a handler process that outlived its coordinator.
ORPHAN_EXIT_STATUS = 70
#: What a child sends once it can start a handler at once (imports done, connected).
READY = "ready"


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
    # Ctrl-C reaches the whole process group; the coordinator decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(parent_pid)
    try:
        runner.warm_up()
        conn.send(READY)
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            if message is None:
                return
            conn.send(answer(runner, message))
    finally:
        runner.dispose()
