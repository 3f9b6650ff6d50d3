"""The executor choices users name, per worker or coordinator-wide.

Each is a small frozen description; ``build`` turns it into a running Executor.
Strings are shortcuts for the defaults: "pool", "spawn", "subprocess", "inline",
"threads", "asyncio".
"""

from __future__ import annotations

import importlib.util
import inspect
import multiprocessing
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..core.errors import ConfigurationError
from .base import Executor, TemplateRunner


def _check_max_tasks(value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigurationError(f"max_tasks_per_child must be an int >= 1, got {value!r}")


def _check_prefetch(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"prefetch must be an int >= 0, got {value!r}")


#: Claimed tasks that may wait for each process while invocations are short (and the
#: horizon allows). A claim is made once half of that room is free, so this sets the
#: claim's batch: 32 took MariaDB from 604 to 715 no-op items/s and PostgreSQL from 614
#: to 689 (medians of alternating runs) against 16, when an item cost ten times what it
#: does now; 64 then was no faster than 32, and is now (``prefetch.PIPE_DEPTH``).
DEFAULT_PREFETCH = 64


def _check_start_method(method: str | None) -> None:
    if method is None:
        return
    if method == "fork":
        raise ConfigurationError(
            "the fork start method is unsafe in the threaded coordinator; use forkserver or spawn"
        )
    if method not in multiprocessing.get_all_start_methods():
        raise ConfigurationError(f"start method {method!r} is not available on this system")


class _Choice:
    """What every executor choice offers besides ``build``."""

    __slots__ = ()

    #: Whether its processes are started by multiprocessing (spawn or forkserver),
    #: which imports the main module again in each of them.
    reruns_main: ClassVar[bool] = False
    #: Whether it runs ``async def`` handlers (and only those).
    runs_async: ClassVar[bool] = False

    def check_handler(self, worker: str, handler: object, source: type[Any]) -> None:
        """Raise ConfigurationError if this executor cannot run ``handler`` (at registration)."""
        check_handler_kind(self, worker, handler)


def is_async_handler(handler: object) -> bool:
    return inspect.iscoroutinefunction(handler)


def check_handler_kind(choice: _Choice, worker: str, handler: object) -> None:
    """An ``async def`` handler needs the asyncio executor, and it only runs those."""
    name = getattr(handler, "__qualname__", repr(handler))
    if inspect.isasyncgenfunction(handler):
        raise ConfigurationError(
            f"the handler {name} of worker {worker!r} is an async generator; a handler "
            "returns Finished() or Unfinished() (async def ... return Finished())"
        )
    wants_async = is_async_handler(handler)
    if wants_async and not choice.runs_async:
        raise ConfigurationError(
            f"the handler {name} of worker {worker!r} is an async def function, which the "
            f"{type(choice).__name__} executor cannot run (it calls handlers with a Session): "
            'use executor="asyncio" (or dbworker.AsyncIO(...)), or define it with def'
        )
    if choice.runs_async and not wants_async:
        raise ConfigurationError(
            f"the handler {name} of worker {worker!r} is a plain def function; the AsyncIO "
            "executor runs async def handlers (taking an AsyncSession): define it with "
            'async def, or use executor="threads" (many sync handlers on threads) or "pool"'
        )


@dataclass(frozen=True, slots=True)
class Pool(_Choice):
    """Persistent child processes (forkserver or spawn), replaced when they die.

    ``max_tasks_per_child`` recycles a child after that many invocations (leaks).
    ``prefetch`` is how many claimed tasks may wait for each process while recent
    invocations are short (0: claim only for an idle process).
    """

    max_tasks_per_child: int | None = None
    start_method: str | None = None
    prefetch: int = DEFAULT_PREFETCH
    reruns_main: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_max_tasks(self.max_tasks_per_child)
        _check_start_method(self.start_method)
        _check_prefetch(self.prefetch)

    def build(self, slots: int, runner: TemplateRunner, parent_pid: int) -> Executor:
        from .pool import ProcessPool

        return ProcessPool(
            slots,
            runner,
            parent_pid,
            self.start_method,
            self.max_tasks_per_child,
            prefetch=self.prefetch,
        )


@dataclass(frozen=True, slots=True)
class SpawnPerTask(_Choice):
    """A fresh process for every invocation: isolation from leaks and native crashes.

    Each process is forked from a template process that has imported the handler,
    initialised the database dialect and configured the mappers, and it connects
    before it is given work: the next one is ready while the current one runs.
    ``start_method`` is how the template (or, without pidfds, each process) starts.
    """

    start_method: str | None = None
    reruns_main: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_start_method(self.start_method)

    def build(self, slots: int, runner: TemplateRunner, parent_pid: int) -> Executor:
        from .spawn import SpawnExecutor, pidfds_supported

        if pidfds_supported():
            return SpawnExecutor(slots, runner, parent_pid, self.start_method)
        from .pool import ProcessPool

        # Without pidfds the coordinator cannot safely watch or kill a process that
        # is not its child: each invocation gets a process started by multiprocessing.
        return ProcessPool(slots, runner, parent_pid, self.start_method, max_tasks_per_child=1)


@dataclass(frozen=True, slots=True)
class Subprocess(_Choice):
    """``python -m`` children with their own interpreter, environment and directory."""

    python: str = field(default_factory=lambda: sys.executable)
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    max_tasks_per_child: int | None = None
    prefetch: int = DEFAULT_PREFETCH

    def __post_init__(self) -> None:
        _check_max_tasks(self.max_tasks_per_child)
        _check_prefetch(self.prefetch)
        if not isinstance(self.python, str) or not self.python:
            raise ConfigurationError(f"python must be an interpreter path, got {self.python!r}")

    def build(self, slots: int, runner: TemplateRunner, parent_pid: int) -> Executor:
        from .subprocess import SubprocessPool

        env = None if self.env is None else dict(self.env)
        return SubprocessPool(
            slots,
            runner,
            parent_pid,
            self.python,
            env,
            self.cwd,
            self.max_tasks_per_child,
            prefetch=self.prefetch,
        )

    def check_handler(self, worker: str, handler: object, source: type[Any]) -> None:
        check_handler_kind(self, worker, handler)
        for what, obj in (("handler", handler), ("source model", source)):
            if getattr(obj, "__module__", None) == "__main__":
                raise ConfigurationError(
                    f"the {what} of worker {worker!r} is defined in __main__, which a "
                    "subprocess executor's interpreter cannot import; move it to an "
                    "importable module"
                )


@dataclass(frozen=True, slots=True)
class Inline(_Choice):
    """Threads in the coordinator's process: for tests and debugging; cannot kill."""

    def build(self, slots: int, runner: TemplateRunner, parent_pid: int) -> Executor:
        from .inline import InlineExecutor

        return InlineExecutor(slots, runner, parent_pid)


def _check_processes(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"processes must be an int >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class Threads(_Choice):
    """Sync handlers on threads of a few processes (one by default): for handlers that
    mostly wait (HTTP calls, other services), many at once without a process each.

    The worker's ``concurrency`` is how many handlers run at once in all, split over
    ``processes``; ``threads`` caps each process's share (None: no cap). Each handler
    has its own Session and transaction, committed with its fenced status change.
    A thread cannot be killed: past its timeout (or when its claim is lost) the
    coordinator records the ending, which fences off whatever the handler commits
    later; its process takes no new work and is replaced once nothing else runs in it.
    ``start_method`` None: the coordinator's own child, forked while the coordinator
    runs one thread, else a new interpreter (``interpreter.py``).
    """

    threads: int | None = None
    processes: int = 1
    start_method: str | None = None
    reruns_main: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.threads is not None:
            _check_processes(self.threads)
        _check_processes(self.processes)
        _check_start_method(self.start_method)

    def build(self, slots: int, runner: TemplateRunner, parent_pid: int) -> Executor:
        from .multiplexed import MultiplexedPool

        if self.threads is not None:
            slots = min(slots, self.threads * self.processes)
        return MultiplexedPool(
            slots, runner, parent_pid, self.processes, start_method=self.start_method
        )


#: The event-loop lag (seconds) reported as a handler blocking the loop.
DEFAULT_LAG_WARNING = 0.25

#: The event loops ``AsyncIO(loop=...)`` runs on, and the dbworker extra of each.
EVENT_LOOPS = {"asyncio": None, "uvloop": "uvloop"}


@dataclass(frozen=True, slots=True)
class AsyncIO(_Choice):
    """``async def`` handlers, taking an ``AsyncSession``, as tasks of one event loop per
    process (one process by default): the worker's ``concurrency`` is how many run at
    once in all, split over ``processes``.

    Each has its own connection and transaction, committed with its fenced status
    change. A timeout cancels the task. ``driver`` is the asyncio driver (default:
    psycopg on PostgreSQL, aiosqlite on SQLite, aiomysql on MySQL and MariaDB); a
    handler that blocks the loop for ``lag_warning`` seconds or more is reported.
    ``loop``: the event loop, the standard library's ``"asyncio"`` or ``"uvloop"``
    (the ``uvloop`` extra).
    ``start_method``: as for ``Threads``.
    """

    processes: int = 1
    driver: str | None = None
    lag_warning: float = DEFAULT_LAG_WARNING
    loop: Literal["asyncio", "uvloop"] = "asyncio"
    start_method: str | None = None
    reruns_main: ClassVar[bool] = True
    runs_async: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_processes(self.processes)
        _check_start_method(self.start_method)
        if (
            isinstance(self.lag_warning, bool)
            or not isinstance(self.lag_warning, int | float)
            or self.lag_warning <= 0
        ):
            raise ConfigurationError(f"lag_warning must be a number > 0, got {self.lag_warning!r}")
        if self.driver is not None and (not isinstance(self.driver, str) or not self.driver):
            raise ConfigurationError(f"driver must be a driver name, got {self.driver!r}")
        if not isinstance(self.loop, str) or self.loop not in EVENT_LOOPS:
            raise ConfigurationError(
                f"loop must be one of {', '.join(map(repr, EVENT_LOOPS))}, got {self.loop!r}"
            )
        extra = EVENT_LOOPS[self.loop]
        if extra is not None and importlib.util.find_spec(self.loop) is None:
            raise ConfigurationError(
                f"AsyncIO(loop={self.loop!r}) needs the {self.loop} package, which is not "
                f"installed: pip install 'dbworker[{extra}]'"
            )

    def build(self, slots: int, runner: TemplateRunner, parent_pid: int) -> Executor:
        from .multiplexed import MultiplexedPool

        return MultiplexedPool(
            slots,
            runner,
            parent_pid,
            self.processes,
            asyncio=True,
            start_method=self.start_method,
            driver=self.driver,
            lag_warning=self.lag_warning,
            loop=self.loop,
        )


ExecutorChoice = Pool | SpawnPerTask | Subprocess | Inline | Threads | AsyncIO
_CHOICES = (Pool, SpawnPerTask, Subprocess, Inline, Threads, AsyncIO)
_NAMED: dict[str, ExecutorChoice] = {
    "pool": Pool(),
    "spawn": SpawnPerTask(),
    "subprocess": Subprocess(),
    "inline": Inline(),
    "threads": Threads(),
    "asyncio": AsyncIO(),
}


def resolve(choice: Any) -> ExecutorChoice:
    if isinstance(choice, _CHOICES):
        return choice
    if isinstance(choice, str) and choice in _NAMED:
        return _NAMED[choice]
    raise ConfigurationError(
        f"unknown executor {choice!r}: use one of {', '.join(map(repr, _NAMED))} or an "
        "instance of Pool, SpawnPerTask, Subprocess, Inline, Threads or AsyncIO"
    )


def chooser(default: ExecutorChoice, given: Any) -> Callable[[object], ExecutorChoice]:
    """How a worker's executor is chosen for its handler: ``given`` (the worker's own,
    checked now) if any; else the coordinator's ``default`` if it runs that kind of
    handler; else ``AsyncIO()`` for an ``async def`` handler and ``Pool()`` for a def."""
    chosen = None if given is None else resolve(given)

    def choose(handler: object) -> ExecutorChoice:
        if chosen is not None:
            return chosen
        wants_async = is_async_handler(handler)
        if wants_async == default.runs_async:
            return default
        return AsyncIO() if wants_async else Pool()

    return choose
