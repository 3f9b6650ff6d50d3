"""The executor boundary: how a claimed item's handler gets run.

An executor receives ``Task`` objects (everything a process needs to run one
invocation and record its outcome under the claim's token) and hands back
``Result`` objects. It knows nothing of dialects or scheduling; the coordinator
knows nothing of processes.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.timing import RetryPolicy

if TYPE_CHECKING:
    from ..dialects import Dialect


class ResultKind(enum.StrEnum):
    FINISHED = "finished"  # recorded by the runner, in the handler's transaction
    UNFINISHED = "unfinished"  # recorded likewise
    FAILED = "failed"  # error recorded as FAILED by the runner
    RETRYING = "retrying"  # error recorded as UNFINISHED under the retry policy
    LOST = "lost"  # the token was stale: nothing of the handler was committed
    #: The runner could not record the outcome (import error, database down): the
    #: coordinator records ``error`` itself, fenced by the same token.
    UNRECORDED = "unrecorded"
    #: The process running the handler died, or was killed (timeout, lost claim).
    CRASHED = "crashed"


TaskKey = tuple[str, Any, int]


@dataclass(frozen=True, slots=True)
class Task:
    worker: str
    source_id: Any
    token: int
    attempt: int
    failures: int
    #: Pickled by reference: the handler and source model must be importable.
    handler: Callable[..., Any]
    source: type[Any]
    retry: RetryPolicy | None = None

    @property
    def key(self) -> TaskKey:
        # The token is part of the key: an item can be claimed again (after
        # Unfinished) before the coordinator has read the previous invocation's result.
        return (self.worker, self.source_id, self.token)


@dataclass(frozen=True, slots=True)
class Result:
    task_key: TaskKey
    kind: ResultKind
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    retry_delay: float | None = None
    exitcode: int | None = None
    duration: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ChildConfig:
    """What every handler process needs to open its own database connections."""

    database_url: str
    engine_options: dict[str, Any]
    parent_pid: int
    #: The dialect class the coordinator resolved (pickled by reference). Without it
    #: a process resolves it again, and a new process pays for scanning every
    #: installed package's entry points: on each invocation under spawn.
    dialect: type[Dialect] | None = None


class Executor(ABC):
    """Runs handlers; at most ``slots`` at a time."""

    def __init__(self, slots: int, config: ChildConfig) -> None:
        self.slots = slots
        self.config = config

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def free_slots(self) -> int: ...

    @abstractmethod
    def submit(self, task: Task) -> None:
        """Start ``task``; the caller ensures a slot is free."""

    @abstractmethod
    def wait_handles(self) -> Sequence[Any]:
        """Objects for ``multiprocessing.connection.wait`` that fire when a result may be ready."""

    @abstractmethod
    def collect(self) -> list[Result]:
        """Results that are ready, including crashes of processes running a task."""

    @abstractmethod
    def kill(self, task_key: TaskKey) -> bool:
        """Stop the handler of ``task_key`` at once; no result will be reported for it."""

    @abstractmethod
    def running(self) -> list[Task]: ...

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every process (running handlers are killed)."""
