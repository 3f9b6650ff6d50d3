"""The lifecycle of a pool's handler processes: launched, seen ready, replaced when
they die, retired after their last task, killed, and ended at shutdown.

Which tasks a process holds, and what becomes of them when it goes, is the pool's
(``pool.py``); this module only starts, watches and ends processes. How a process is
launched and what it says when ready are the pool's hooks (spawn-per-task forks
from a template, the subprocess executor runs another interpreter).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import logging
import multiprocessing
import os
import pickle
import select
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from ..core.errors import HelperProcessError
from ..core.tasks import Task
from .process import describe_exit, receive, send

#: How long shutdown waits for an idle child to exit before killing it.
EXIT_GRACE_SECONDS = 5.0
#: How many times a process start is tried when the helper that starts processes
#: (multiprocessing's fork server) died under it; multiprocessing starts a new fork
#: server on the next try.
LAUNCH_ATTEMPTS = 3
#: The wait before each further try.
LAUNCH_RETRY_SECONDS = 0.2
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


def single_threaded() -> bool:
    """Whether this process runs one thread (native threads included)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no /proc: cannot tell
        return False


def forked(
    target: Callable[..., None], name: str, runner: Any, *args: Any, prepared: bool = False
) -> tuple[ProcessHandle, Connection] | None:
    """``target(its end of a new pipe, a copy of runner, *args)`` in a fork of this
    process, if this process runs a single thread; else None (nothing started).
    ``prepared``: the copy is ``runner.for_fork()``, the same for every fork."""
    if not single_threaded() or "fork" not in multiprocessing.get_all_start_methods():
        return None
    # A copy, as the other start methods pass it: only its configuration.
    fresh = runner.for_fork() if prepared else pickle.loads(pickle.dumps(runner))
    if prepared and not single_threaded():
        return None  # preparing it started a thread (a driver's, say): no fork now
    gc.freeze()
    try:
        return start_process(multiprocessing.get_context("fork"), target, name, fresh, *args)
    finally:
        gc.unfreeze()


def start_process(
    context: Any, target: Callable[..., None], name: str, *args: Any
) -> tuple[Any, Connection]:
    """Start ``target(its end of a new pipe, *args)`` in a process of ``context``
    (a multiprocessing context); return the process and our end of the pipe."""
    for attempt in range(1, LAUNCH_ATTEMPTS + 1):
        ours, theirs = context.Pipe()
        # Not daemonic: a daemonic process may not start processes of its own,
        # and handlers are free to. Shutdown and the parent watch end them instead.
        process = context.Process(target=target, args=(theirs, *args), name=name)
        try:
            process.start()
        except (EOFError, ConnectionError) as exc:
            # The fork server died while it was starting this process (killed, the OOM
            # killer): its socket closed mid-request. multiprocessing sees it dead on
            # the next start and launches a new one.
            ours.close()
            theirs.close()
            if attempt == LAUNCH_ATTEMPTS:
                raise HelperProcessError(
                    f"cannot start a {name} process: the {context.get_start_method()} "
                    f"helper process died {attempt} times while starting it "
                    f"({type(exc).__name__}: {str(exc) or 'connection closed'})"
                ) from exc
            log.warning(
                "dbworker: the %s helper process died while starting a %s process (%s); "
                "trying again",
                context.get_start_method(),
                name,
                type(exc).__name__,
            )
            time.sleep(LAUNCH_RETRY_SECONDS)
            continue
        theirs.close()
        return process, ours
    raise AssertionError("unreachable")  # pragma: no cover


class ProcessHandle(Protocol):
    """The part of multiprocessing's Process the pool uses; subprocesses adapt to it."""

    @property
    def exitcode(self) -> int | None: ...

    @property
    def sentinel(self) -> Any: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


def end(process: ProcessHandle, timeout: float) -> None:
    """Wait up to ``timeout`` for ``process`` to exit (it was asked to), then kill it."""
    process.join(max(0.0, timeout))
    if process.is_alive():
        process.kill()
        process.join()


@dataclass(slots=True)
class Child:
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

    def receive(self) -> Any:
        """Its next message if one has arrived, else None (also once its pipe closed)."""
        try:
            if self.readable():
                return receive(self.conn)
        except (EOFError, OSError):
            pass
        return None

    def alive(self, exits: Container[int] | None = None) -> bool:
        """Whether the process runs (its sentinel, when it has one, says so cheaply).
        ``exits``: the pool's ``Exits`` of this pass, which asks every child at once."""
        sentinel = self.process.sentinel
        if isinstance(sentinel, int) and sentinel not in (
            exits if exits is not None else Exits([self])
        ):
            return True
        return bool(self.process.is_alive())


class Exits:
    """Which of a pool's processes may have ended, as their sentinels say: asked of
    all of them in one system call, at the first ``in`` (``Child.alive(exits)``), where
    each child's own look was one (after an idle spell, tens of microseconds each)."""

    def __init__(self, children: Sequence[Child]) -> None:
        self._children = children
        self._readable: set[int] | None = None

    def __contains__(self, sentinel: object) -> bool:
        if self._readable is None:
            self._readable = self._look()
        return sentinel in self._readable

    def _look(self) -> set[int]:
        sentinels = [s for c in self._children if isinstance(s := c.process.sentinel, int)]
        watch = select.poll()
        for sentinel in sentinels:
            watch.register(sentinel, select.POLLIN)
        try:
            return {fd for fd, _ in watch.poll(0)}
        except OSError:
            return set(sentinels)  # each child's process is asked itself


class Children:
    """A pool's processes, by slot: ``members[i]`` is replaced in place, so the pool's
    loops can hold and index the list itself.

    ``launch`` starts a process; ``ready_message`` tells whether a child's first
    message says it is ready; ``closed_before_ready`` hears of a child whose pipe
    closed before that (it died starting).
    """

    def __init__(
        self,
        launch: Callable[[], tuple[ProcessHandle, Connection]],
        ready_message: Callable[[Child, Any], bool],
        closed_before_ready: Callable[[Child], None],
    ) -> None:
        self._launch = launch
        self._ready_message = ready_message
        self._closed_before_ready = closed_before_ready
        self.members: list[Child] = []
        #: Recycled children on their way out, with the time to stop waiting for them.
        self._retiring: list[tuple[ProcessHandle, float]] = []
        #: Children in a row that died before they were ready.
        self._startup_failures = 0

    def start(self, count: int) -> None:
        while len(self.members) < count:
            self.members.append(self._spawn())

    def _spawn(self) -> Child:
        process, conn = self._launch()
        return Child(process, conn)

    def check_ready(self, child: Child) -> None:
        """Mark ``child`` ready if it said so; schedule its replacement if it died first."""
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

    def replace(self, index: int) -> None:
        """Start a successor to the (dead or killed) child at ``index``."""
        old = self.members[index]
        old.conn.close()
        old.process.join(0)
        self.members[index] = self._spawn()

    def kill(self, index: int) -> list[Task]:
        """Kill the child at ``index`` (``replace`` it next); return the tasks it had
        not started."""
        child = self.members[index]
        child.process.kill()
        child.process.join()
        rest = list(child.tasks)[1:]
        child.tasks.clear()
        return rest

    def retire(self, index: int) -> None:
        # Ask the child to exit and start its successor at once; waiting for the
        # exit here would hold up the scheduler's loop (every worker's results,
        # renewals and claims) for each recycled child: on every item under spawn.
        child = self.members[index]
        with contextlib.suppress(OSError):
            send(child.conn, None)
        child.conn.close()
        self._retiring.append((child.process, time.monotonic() + EXIT_GRACE_SECONDS))
        self.members[index] = self._spawn()

    def reap(self) -> None:
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

    def shutdown(self) -> None:
        """Tell idle children to exit, kill busy ones, and wait for all of them (idle
        and retiring ones up to EXIT_GRACE_SECONDS, then killed)."""
        for child in self.members:
            with contextlib.suppress(OSError):
                if not child.tasks:
                    send(child.conn, None)
                else:
                    child.process.kill()
        deadline = time.monotonic() + EXIT_GRACE_SECONDS
        for child in self.members:
            end(child.process, deadline - time.monotonic())
            child.conn.close()
        self.members.clear()
        for process, _ in self._retiring:
            end(process, deadline - time.monotonic())
        self._retiring.clear()
