"""What a process of the threads or asyncio executor runs: several tasks at once.

Tasks arrive over the pipe. The coordinator sends a process as many as it has room
for, and then some more claimed ahead (``(AHEAD, task)``): those wait here, first come
first served, and each starts as soon as a slot frees, without a trip to the
coordinator and back (in benchmarks.io that trip was a median 19 ms, up to 111, in
every slot at every wave). A task sent ahead that starts is reported to the
coordinator (it counts timeouts from the start): ``(STARTED, keys, result)`` carries
it with the result of the task whose slot it took, or alone (``result`` None) when
it found a slot free on arrival. Each result goes back as soon as its task ends, in
whatever order they end.

A withdrawn task (``(CANCEL, key)``: its timeout, a lost claim, a stop) that waits here
is dropped and answered with ``(CANCELLED, key)``; one that runs is cancelled on the
event loop and answered the same way; a thread cannot be stopped, so the threads
process lets it run and the coordinator recycles the process once nothing else runs
in it (``multiplexed.py``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import select
import signal
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from ..core.tasks import (
    Result,
    ResultKind,
    Task,
    TaskKey,
    TaskMessage,
    describe,
    task_from_message,
)
from .base import ConcurrentRunner
from .process import (
    CANCEL,
    READY,
    default_signals,
    message_key,
    receive,
    send,
    watch_parent,
)

#: (CANCELLED, key): a withdrawn task ended without a result (its transaction rolled
#: back), or never started.
CANCELLED = "cancelled"
#: (AHEAD, task message): a task sent ahead, to start when a slot frees.
AHEAD = "ahead"
#: (STARTED, [keys], result or None): tasks sent ahead that started (see the docstring).
STARTED = "started"
#: (TOGETHER, [messages]): several messages in one write: what the coordinator sends a
#: process in one dispatch, or what a process sends in one pass of its loop.
TOGETHER = "together"
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
    default_signals()
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


class _ThreadsOutbox:
    """What the threads send, sent by a thread of its own: what the others put while it
    waits for its turn goes in one write. Each handler thread reported its own start,
    and the ending thread each result, with a write of its own: 100 writes for a wave
    of 50, each a turn of the GIL given up and waited for again, and as many reads
    for the coordinator. (Alone, it did not change ``benchmarks.io``'s drain time.)"""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._pending: list[Any] = []
        self._changed = threading.Condition()
        self._closed = False
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name="dbworker-outbox", daemon=True)
        self._thread.start()

    def put(self, message: Any) -> None:
        with self._changed:
            if not self._stopped:
                self._pending.append(message)
                self._changed.notify()
                return
            # Stopped: endings delivered as the process stops go as they come.
            with contextlib.suppress(OSError):
                send(self._conn, message)

    def _serve(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._closed:
                    self._changed.wait()
                pending, self._pending = self._pending, []
                if not pending:
                    self._stopped = True  # after every message put before was sent
                    return
            with contextlib.suppress(OSError):
                send(self._conn, pending[0] if len(pending) == 1 else (TOGETHER, pending))

    def close(self) -> None:
        """Send what is pending, then stop; what comes later is sent as it comes."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout=30)


def _serve_threads(conn: Connection, runner: ConcurrentRunner, capacity: int) -> None:
    outbox = _ThreadsOutbox(conn)
    try:
        _serve_threads_with(conn, runner, capacity, outbox.put)
    finally:
        outbox.close()


def _serve_threads_with(
    conn: Connection, runner: ConcurrentRunner, capacity: int, reply: Callable[[Any], None]
) -> None:
    waiting: collections.deque[Waiting] = collections.deque()
    arrived = threading.Condition()

    def serve() -> None:
        ended: Result | None = None
        while True:
            with arrived:
                while ended is None and not waiting:
                    arrived.wait()
                entry = waiting.popleft() if waiting else None
            # The next task is taken before the last one's result goes: a task sent
            # ahead starts now, and its start travels with that result.
            if entry is not None and entry.ahead:
                reply((STARTED, [entry.key], ended))
            elif ended is not None:
                reply(ended)
            if entry is None:
                ended = None
                continue
            task = entry.task
            try:
                # None: its ending goes with others', and ``reply`` sends its result.
                ended = task if isinstance(task, Result) else runner.run_later(task, reply)
            except BaseException as exc:
                ended = _crashed(entry.key, exc)

    # Daemon threads: a handler stuck for good must not keep the process from exiting.
    for number in range(capacity):
        threading.Thread(target=serve, name=f"dbworker-handler-{number}", daemon=True).start()

    def hand_over(arrivals: list[Waiting]) -> None:
        with arrived:
            waiting.extend(arrivals)
            arrived.notify(len(arrivals))
        arrivals.clear()

    while True:
        message = receive(conn)
        if message is None:
            return
        # The tasks of one message are all decoded, and their rows asked for, before a
        # thread is woken: a woken thread holds the GIL that reading the rest waits for.
        arrivals: list[Waiting] = []
        for one in _unpacked(message):
            if one[0] == CANCEL:
                hand_over(arrivals)  # a cancel applies to what arrived before it
                # Dropped if it waits; a thread cannot be stopped (see the docstring).
                with arrived:
                    dropped = _drop(waiting, one[1])
                if dropped:
                    runner.forget_waiting(one[1])
                    reply((CANCELLED, one[1]))
                continue
            entry = Waiting.of(one)
            # It may wait for a thread (its row is read meanwhile), or starts now (its
            # row is read with those of the others arriving with it).
            _prepare(runner, entry, starting=not entry.ahead)
            arrivals.append(entry)
        if arrivals:
            hand_over(arrivals)


def _unpacked(message: Any) -> Sequence[Any]:
    """The messages ``message`` carries: several in one write (``TOGETHER``), or itself."""
    return message[1] if message[0] == TOGETHER else (message,)


class Waiting(NamedTuple):
    """A task in the process that waits for a slot, decoded once as it arrives: its
    key, the task (or the result that answers it, if it cannot run here), and whether
    it was sent ahead."""

    key: TaskKey
    task: Task | Result
    ahead: bool

    @classmethod
    def of(cls, message: Any) -> Waiting:
        ahead = message[0] == AHEAD
        body: TaskMessage = message[1] if ahead else message
        key = message_key(body)
        try:
            task = task_from_message(body)
        except Exception as exc:
            task = _crashed(key, exc)
        return cls(key, task, ahead)


def _prepare(runner: ConcurrentRunner, entry: Waiting, starting: bool = False) -> None:
    """A task that may wait for a slot: the runner may get its start ready (its row
    read), so that it starts at once when one frees; or one that starts now."""
    if isinstance(entry.task, Result):  # its start reports what went wrong
        return
    if starting:
        runner.prepare_start(entry.task)
    else:
        runner.prepare_waiting(entry.task)


def _drop(waiting: collections.deque[Waiting], key: TaskKey) -> bool:
    """Take the task ``key`` out of ``waiting``; whether it was there."""
    for entry in waiting:
        if entry.key == key:
            waiting.remove(entry)
            return True
    return False


# -- asyncio ---------------------------------------------------------------------------


def asyncio_main(
    conn: Connection,
    runner: ConcurrentRunner,
    parent_pid: int,
    capacity: int,
    driver: str | None,
    lag_warning: float,
    loop: str = "asyncio",
) -> None:
    """A process running ``async def`` handlers, up to ``capacity`` at once, as tasks of
    one event loop (``loop``: "asyncio" or "uvloop")."""
    _start(conn, parent_pid)
    try:
        with asyncio.Runner(loop_factory=_loop_factory(loop)) as running:
            running.run(_LoopServer(conn, runner, lag_warning).serve(capacity, driver))
    finally:
        runner.dispose()


def _loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if loop == "uvloop":
        import uvloop  # checked by AsyncIO(loop=...): installed

        return uvloop.new_event_loop
    return None  # the standard library's


class _LoopServer:
    def __init__(self, conn: Connection, runner: ConcurrentRunner, lag_warning: float) -> None:
        self.conn = conn
        self.runner = runner
        self.lag_warning = lag_warning
        self.capacity = 1
        self.running: dict[TaskKey, asyncio.Task[None]] = {}
        #: Those of ``running`` whose handler returned: their slot is free while their
        #: ending commits.
        self.returned: set[TaskKey] = set()
        #: Tasks sent ahead, waiting for a slot.
        self.waiting: collections.deque[Waiting] = collections.deque()
        #: Messages to send at the end of this pass of the loop (``_send``).
        self.outbox: list[Any] = []
        self.arrived = select.poll()
        self.arrived.register(conn.fileno(), select.POLLIN)

    async def serve(self, capacity: int, driver: str | None) -> None:
        self.capacity = capacity
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
            self.waiting.clear()
            for task in list(self.running.values()):
                task.cancel()
            await asyncio.gather(watch, *self.running.values(), return_exceptions=True)
            await self.runner.dispose_async()
            if self.outbox:
                self._flush()

    def _read(self, loop: asyncio.AbstractEventLoop, stopping: asyncio.Future[None]) -> None:
        try:
            while self.arrived.poll(0):
                message = receive(self.conn)
                if message is None:
                    break
                for one in _unpacked(message):
                    self._arrived(loop, one)
            else:
                return
        except (EOFError, OSError):
            pass
        if not stopping.done():
            stopping.set_result(None)

    def _arrived(self, loop: asyncio.AbstractEventLoop, message: Any) -> None:
        if message[0] == CANCEL:
            task = self.running.get(message[1])
            if task is not None:
                task.cancel()
            elif _drop(self.waiting, message[1]):
                self.runner.forget_waiting(message[1])
                self._send((CANCELLED, message[1]))
            return
        entry = Waiting.of(message)
        self.waiting.append(entry)
        started = self._start_waiting(loop)
        if started:
            self._send((STARTED, started, None))
        if self.waiting and self.waiting[-1] is entry:
            _prepare(self.runner, entry)

    def _start_waiting(self, loop: asyncio.AbstractEventLoop) -> list[TaskKey]:
        """Start waiting tasks while there is room; the keys of those sent ahead."""
        started: list[TaskKey] = []
        while self.waiting and len(self.running) - len(self.returned) < self.capacity:
            key, task, ahead = self.waiting.popleft()
            self.running[key] = loop.create_task(self._one(key, task))
            if ahead:
                started.append(key)
        return started

    async def _one(self, key: TaskKey, task: Task | Result) -> None:
        loop = asyncio.get_running_loop()

        def returned() -> None:
            # The handler is done: the next task may start while this one's ending
            # commits (a wave's endings would otherwise delay every next start).
            self.returned.add(key)
            started = self._start_waiting(loop)
            if started:
                self._send((STARTED, started, None))

        try:
            if isinstance(task, Result):
                result = task
            else:
                result = await self.runner.run_async(task, returned)
        except asyncio.CancelledError:
            result = None
        except Exception as exc:
            result = _crashed(key, exc)
        finally:
            self.running.pop(key, None)
            self.returned.discard(key)
        ended: Any = (CANCELLED, key) if result is None else result
        started = self._start_waiting(loop)
        if started:
            if result is None:
                self._send(ended)
                ended = None
            ended = (STARTED, started, ended)
        self._send(ended)

    def _send(self, message: Any) -> None:
        """Send ``message`` at the end of this pass of the loop, with whatever else the
        pass sends: a wave of handlers returning together sends their starts and
        results in one write, which the scheduler reads at once."""
        if not self.outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self.outbox.append(message)

    def _flush(self) -> None:
        outbox, self.outbox = self.outbox, []
        message = outbox[0] if len(outbox) == 1 else (TOGETHER, outbox)
        with contextlib.suppress(OSError):
            send(self.conn, message)

    async def _watch_lag(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_PROBE_SECONDS)
            lag = loop.time() - before - LAG_PROBE_SECONDS
            if lag >= self.lag_warning:
                self._send((LOOP_LAG, lag, len(self.running)))
