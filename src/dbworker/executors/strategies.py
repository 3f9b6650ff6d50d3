"""The executor choices users name, per worker or coordinator-wide.

Each is a small frozen description; ``build`` turns it into a running Executor.
Strings are shortcuts for the defaults: "pool", "spawn", "subprocess", "inline".
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..core.errors import ConfigurationError
from .base import Executor, TemplateRunner


def _check_max_tasks(value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigurationError(f"max_tasks_per_child must be an int >= 1, got {value!r}")


def _check_prefetch(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"prefetch must be an int >= 0, got {value!r}")


#: Claimed tasks that may wait for each process while invocations are short (and the
#: 50 ms horizon allows). A claim is made once half of that room is free, so this sets
#: the claim's batch: 32 took MariaDB from 604 to 715 no-op items/s and PostgreSQL from
#: 614 to 689 (medians of alternating runs) against 16; 64 was no faster than 32.
DEFAULT_PREFETCH = 32


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

    def check_handler(self, worker: str, handler: object, source: type[Any]) -> None:
        """Raise ConfigurationError if this executor cannot run ``handler`` (at registration)."""


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


ExecutorChoice = Pool | SpawnPerTask | Subprocess | Inline
_NAMED: dict[str, ExecutorChoice] = {
    "pool": Pool(),
    "spawn": SpawnPerTask(),
    "subprocess": Subprocess(),
    "inline": Inline(),
}


def resolve(choice: Any) -> ExecutorChoice:
    if isinstance(choice, Pool | SpawnPerTask | Subprocess | Inline):
        return choice
    if isinstance(choice, str) and choice in _NAMED:
        return _NAMED[choice]
    raise ConfigurationError(
        f"unknown executor {choice!r}: use one of {', '.join(map(repr, _NAMED))} or an "
        "instance of Pool, SpawnPerTask, Subprocess or Inline"
    )
