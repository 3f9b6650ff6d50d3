"""The pure core: statuses, outcomes, the transition table, the failure policy, timing
arithmetic, the task and result records, errors.

No SQL, no I/O, no clock reads, no threads.
"""

from .errors import (
    Cancelled,
    ConfigurationError,
    DBWorkerError,
    HandlerContractError,
    HandlerTimeout,
    InvalidTransition,
    StaleToken,
    UnknownWorkerError,
    WorkerCrashed,
)
from .event_kinds import EventKind
from .outcomes import Finished, Outcome, Unfinished
from .policy import DATABASE_RETRY, Decision, Ending, decide
from .status import OPEN, TERMINAL, ExecutionStatus, Phase
from .tasks import ErrorInfo, Result, ResultKind, Task, TaskKey, describe
from .timing import PollBackoff, RetryPolicy, Timings
from .transitions import ROWS, TRANSITIONS, Record, Row, Transition

__all__ = [
    "DATABASE_RETRY",
    "OPEN",
    "ROWS",
    "TERMINAL",
    "TRANSITIONS",
    "Cancelled",
    "ConfigurationError",
    "DBWorkerError",
    "Decision",
    "Ending",
    "ErrorInfo",
    "EventKind",
    "ExecutionStatus",
    "Finished",
    "HandlerContractError",
    "HandlerTimeout",
    "InvalidTransition",
    "Outcome",
    "Phase",
    "PollBackoff",
    "Record",
    "Result",
    "ResultKind",
    "RetryPolicy",
    "Row",
    "StaleToken",
    "Task",
    "TaskKey",
    "Timings",
    "Transition",
    "Unfinished",
    "UnknownWorkerError",
    "WorkerCrashed",
    "decide",
    "describe",
]
