"""What a process of the threads or asyncio executor runs: several tasks at once.

Tasks arrive over the pipe and start at once (the coordinator sends a process no
more than it has room for); each result goes back as soon as its task ends, in
whatever order they end. A withdrawn task (``(CANCEL, key)``: its timeout, a lost
claim, a stop) is cancelled on the event loop and answered with ``(CANCELLED, key)``;
a thread cannot be stopped, so the threads process ignores it and the coordinator
recycles the process once nothing else runs in it (``multiplexed.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import select
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from ..core.tasks import Result, ResultKind, TaskKey, TaskMessage, describe, task_from_message
from .base import ConcurrentRunner
from .process import CANCEL, READY, answer, message_key, receive, send, watch_parent

#: (CANCELLED, key): a withdrawn task ended without a result (its transaction rolled back).
CANCELLED = "cancelled"
#: (LOOP_LAG, seconds, tasks running): the event loop was blocked that long (a handler
#: that does not await: blocking I/O, or CPU work), starving the others meanwhile.
LOOP_LAG = "loop_lag"
#: How often the event loop's lag is measured.
LAG_PROBE_SECONDS = 0.05


def _crashed(key: TaskKey, exc: BaseException) -> Result:
    """A runtime error (not the handler's: the runner records those) as the task's."""
    info = describe(exc)
    return Result(key, ResultKind.UNRECORDED, info.message, info.type, info.traceback)


def _start(conn: Connection, parent_pid: int) -> None:
    # A process forked from the coordinator (``interpreter.py``) inherited the
    # application's Python signal handlers: back to a new interpreter's defaults.
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)
    # Ctrl-C reaches the whole process group; the coordinator decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(parent_pid)


# -- threads ---------------------------------------------------------------------------


def threads_main(
    conn: Connection, runner: ConcurrentRunner, parent_pid: int, capacity: int
) -> None:
    """A process running sync handlers on ``capacity`` threads, each invocation in its
    own transaction on its thread's own connection."""
    _start(conn, parent_pid)
    runner.concurrent(capacity)
    try:
        runner.warm_up()
        send(conn, READY)
        with contextlib.suppress(EOFError, OSError):
            _serve_threads(conn, runner, capacity)
    finally:
        runner.dispose()


def _serve_threads(conn: Connection, runner: ConcurrentRunner, capacity: int) -> None:
    work: queue.SimpleQueue[TaskMessage] = queue.SimpleQueue()
    sending = threading.Lock()

    def serve() -> None:
        while True:
            message = work.get()
            try:
                result = answer(runner, message)
            except BaseException as exc:
                result = _crashed(message_key(message), exc)
            with sending, contextlib.suppress(OSError):
                send(conn, result)

    # Daemon threads: a handler stuck for good must not keep the process from exiting.
    for number in range(capacity):
        threading.Thread(target=serve, name=f"dbworker-handler-{number}", daemon=True).start()
    while True:
        message = receive(conn)
        if message is None:
            return
        if message[0] != CANCEL:  # a thread cannot be stopped (see the module's docstring)
            work.put(message)


# -- asyncio ---------------------------------------------------------------------------


def asyncio_main(
    conn: Connection,
    runner: ConcurrentRunner,
    parent_pid: int,
    capacity: int,
    driver: str | None,
    lag_warning: float,
) -> None:
    """A process running ``async def`` handlers, up to ``capacity`` at once, as tasks of
    one event loop."""
    _start(conn, parent_pid)
    try:
        asyncio.run(_LoopServer(conn, runner, lag_warning).serve(capacity, driver))
    finally:
        runner.dispose()


class _LoopServer:
    def __init__(self, conn: Connection, runner: ConcurrentRunner, lag_warning: float) -> None:
        self.conn = conn
        self.runner = runner
        self.lag_warning = lag_warning
        self.running: dict[TaskKey, asyncio.Task[None]] = {}
        self.arrived = select.poll()
        self.arrived.register(conn.fileno(), select.POLLIN)

    async def serve(self, capacity: int, driver: str | None) -> None:
        await self.runner.start_async(capacity, driver)
        send(self.conn, READY)
        loop = asyncio.get_running_loop()
        stopping: asyncio.Future[None] = loop.create_future()
        loop.add_reader(self.conn.fileno(), self._read, loop, stopping)
        watch = loop.create_task(self._watch_lag(loop))
        try:
            await stopping
        finally:
            loop.remove_reader(self.conn.fileno())
            watch.cancel()
            for task in list(self.running.values()):
                task.cancel()
            await asyncio.gather(watch, *self.running.values(), return_exceptions=True)
            await self.runner.dispose_async()

    def _read(self, loop: asyncio.AbstractEventLoop, stopping: asyncio.Future[None]) -> None:
        try:
            while self.arrived.poll(0):
                message = receive(self.conn)
                if message is None:
                    break
                if message[0] == CANCEL:
                    task = self.running.get(message[1])
                    if task is not None:
                        task.cancel()
                    continue
                key = message_key(message)
                self.running[key] = loop.create_task(self._one(key, message))
            else:
                return
        except (EOFError, OSError):
            pass
        if not stopping.done():
            stopping.set_result(None)

    async def _one(self, key: TaskKey, message: TaskMessage) -> None:
        try:
            task = task_from_message(message)
            if isinstance(task, Result):
                result = task
            else:
                result = await self.runner.run_async(task)
        except asyncio.CancelledError:
            result = None
        except Exception as exc:
            result = _crashed(key, exc)
        finally:
            self.running.pop(key, None)
        self._send((CANCELLED, key) if result is None else result)

    def _send(self, message: Any) -> None:
        with contextlib.suppress(OSError):
            send(self.conn, message)

    async def _watch_lag(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_PROBE_SECONDS)
            lag = loop.time() - before - LAG_PROBE_SECONDS
            if lag >= self.lag_warning:
                self._send((LOOP_LAG, lag, len(self.running)))
