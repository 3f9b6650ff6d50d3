"""A handler's exception, as every invocation path records it: the failure policy's
decision, and the result each outcome of writing it comes to. The single path, a group
and the event loop differ only in where they write the record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.policy import Decision, Ending, decide
from ..core.tasks import ErrorInfo, Result, ResultKind, Task, describe


@dataclass(frozen=True, slots=True)
class HandlerFailure:
    task: Task
    info: ErrorInfo
    decision: Decision

    @classmethod
    def of(cls, task: Task, exc: BaseException, *, transient: bool) -> HandlerFailure:
        decision = decide(
            Ending.RAISED,
            failures=task.failures,
            retry=task.retry,
            error=exc,
            transient=transient,
        )
        return cls(task, describe(exc), decision)

    def result(self, kind: ResultKind, **extra: Any) -> Result:
        info = self.info
        return Result(
            self.task.key,
            kind,
            error=info.message,
            error_type=info.type,
            traceback=info.traceback,
            retry_delay=None if self.decision.gives_up else self.decision.delay,
            extra=extra,
        )

    def unrecorded(self, db_exc: BaseException) -> Result:
        """The record could not be written: the coordinator will write it instead."""
        return self.result(ResultKind.UNRECORDED, recording_error=repr(db_exc))

    def written(self, done: bool) -> Result:
        """The fenced record was written (``done``) or matched nothing (the claim is lost)."""
        if not done:
            return self.result(ResultKind.LOST)
        return self.result(ResultKind.FAILED if self.decision.gives_up else ResultKind.RETRYING)
