"""The pure core: statuses, outcomes, the transition table, timing arithmetic, errors.

No SQL, no I/O, no clock reads, no threads.
"""

from .errors import (
    ConfigurationError,
    DBWorkerError,
    HandlerContractError,
    HandlerTimeout,
    InvalidTransition,
    StaleToken,
    UnknownWorkerError,
    WorkerCrashed,
)
from .outcomes import Finished, Outcome, Unfinished
from .status import OPEN, TERMINAL, ExecutionStatus, Phase
from .timing import PollBackoff, RetryPolicy, Timings
from .transitions import TRANSITIONS, Event, Record

__all__ = [
    "OPEN",
    "TERMINAL",
    "TRANSITIONS",
    "ConfigurationError",
    "DBWorkerError",
    "Event",
    "ExecutionStatus",
    "Finished",
    "HandlerContractError",
    "HandlerTimeout",
    "InvalidTransition",
    "Outcome",
    "Phase",
    "PollBackoff",
    "Record",
    "RetryPolicy",
    "StaleToken",
    "Timings",
    "Unfinished",
    "UnknownWorkerError",
    "WorkerCrashed",
]
