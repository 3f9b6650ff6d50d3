"""dbworker: background work in process workers, coordinated through your SQL database."""

from .coordinator import Coordinator
from .core.errors import (
    ConfigurationError,
    DBWorkerError,
    HandlerContractError,
    HandlerTimeout,
    UnknownWorkerError,
    WorkerCrashed,
)
from .core.outcomes import Finished, Outcome, Unfinished
from .core.status import ExecutionStatus
from .core.timing import RetryPolicy
from .drain import DrainedItem, DrainReport
from .executors import Inline, Pool, SpawnPerTask, Subprocess
from .health import Health
from .records import ExecutionState, FailedItem
from .worker import Worker

__all__ = [
    "ConfigurationError",
    "Coordinator",
    "DBWorkerError",
    "DrainReport",
    "DrainedItem",
    "ExecutionState",
    "ExecutionStatus",
    "FailedItem",
    "Finished",
    "HandlerContractError",
    "HandlerTimeout",
    "Health",
    "Inline",
    "Outcome",
    "Pool",
    "RetryPolicy",
    "SpawnPerTask",
    "Subprocess",
    "Unfinished",
    "UnknownWorkerError",
    "Worker",
    "WorkerCrashed",
]
