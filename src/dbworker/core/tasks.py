"""What travels between the scheduler, an executor and a handler process.

A ``Task`` is everything one invocation needs; a ``Result`` is what came of it.
Both are plain data: executors move them (or their encoded forms) without
knowing what they mean to the database.
"""

from __future__ import annotations

import enum
import pickle
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .timing import RetryPolicy

#: Error text is bounded where it is born, so a huge exception message cannot bloat
#: the execution table, the pipes, or every log record.
MAX_ERROR_CHARS = 4000
MAX_ERROR_TYPE_CHARS = 255
MAX_TRACEBACK_CHARS = 16000


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
    #: Whether the worker's table has ``held_key`` (``exclusive_by``), which every
    #: ending of the invocation clears.
    keyed: bool = False
    #: Never run in a group (several items in one transaction): its worker has a
    #: timeout, which counts from the handler's own start and stops the process.
    alone: bool = False
    #: The source row's column values (as ``invocation.loading`` reads them), read in
    #: the claim's transaction for a task that starts at once in an idle process: its
    #: handler process then sends no read of its own (``Registration.source_rows``).
    row: tuple[Any, ...] | None = None

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

    def __reduce__(self) -> tuple[Any, ...]:
        # A plain tuple of the fields: a result crosses a pipe for every invocation,
        # and a dataclass's default pickling costs several times as much.
        return (
            _result,
            (
                self.task_key,
                self.kind.value,
                self.error,
                self.error_type,
                self.traceback,
                self.retry_delay,
                self.exitcode,
                self.duration,
                self.extra,
            ),
        )


def _result(task_key: TaskKey, kind: str, *rest: Any) -> Result:
    return Result(task_key, ResultKind(kind), *rest)


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    message: str
    type: str | None = None
    traceback: str | None = None


def bounded(text: str | None, limit: int) -> str | None:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if text is None or len(text) <= limit:
        return text
    marker = f"... [{len(text) - limit} characters cut]"
    return text[: limit - len(marker)] + marker


def describe(exc: BaseException) -> ErrorInfo:
    """An exception as the execution table stores it: message, qualified type, traceback."""
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    message = f"{kind.__name__}: {exc}" if str(exc) else kind.__name__
    trace = "".join(traceback.format_exception(exc))
    return ErrorInfo(
        bounded(message, MAX_ERROR_CHARS) or message,
        name,
        bounded(trace, MAX_TRACEBACK_CHARS) or trace,
    )


# -- the task message ---------------------------------------------------------------------
#
# A task crosses a pipe as (header, payload): the header is plain values, the payload
# the pickled handler, source model and retry policy, which are the same for every task
# of a worker and so are pickled once per worker.

TaskHeader = tuple[str, Any, int, int, int, tuple[Any, ...] | None]
TaskMessage = tuple[TaskHeader, bytes]


def task_payload(task: Task) -> bytes:
    return pickle.dumps((task.handler, task.source, task.retry, task.keyed))


def task_message(task: Task, payload: bytes) -> TaskMessage:
    header = (task.worker, task.source_id, task.token, task.attempt, task.failures, task.row)
    return header, payload


#: Payloads already unpickled in this process: every task of a worker carries the same
#: one, and unpickling it imports by name each time. Bounded, for processes that serve
#: many workers (or workers whose payload changes when their module is reloaded).
MAX_DECODED_PAYLOADS = 64
_decoded: dict[bytes, tuple[Callable[..., Any], type[Any], RetryPolicy | None, bool]] = {}


def task_from_message(message: TaskMessage) -> Task | Result:
    """The task ``message`` carries, or an UNRECORDED result when its handler cannot
    be imported in this process."""
    (worker, source_id, token, attempt, failures, row), payload = message
    try:
        decoded = _decoded.get(payload)
        if decoded is None:
            decoded = pickle.loads(payload)
            if len(_decoded) >= MAX_DECODED_PAYLOADS:
                _decoded.clear()
            _decoded[payload] = decoded
        handler, source, retry, keyed = decoded
    except Exception as exc:
        info = describe(exc)
        return Result(
            (worker, source_id, token),
            ResultKind.UNRECORDED,
            error=f"cannot import the handler in the worker process: {info.message}",
            error_type=info.type,
            traceback=info.traceback,
        )
    return Task(worker, source_id, token, attempt, failures, handler, source, retry, keyed, row=row)
