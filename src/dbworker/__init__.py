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
from .events import Event, EventKind, Events
from .executors import Inline, Pool, SpawnPerTask, Subprocess
from .health import Health
from .metrics import PrometheusMetrics, prometheus_metrics
from .records import ExecutionState, FailedItem
from .worker import Worker

__all__ = [
    "ConfigurationError",
    "Coordinator",
    "DBWorkerError",
    "DrainReport",
    "DrainedItem",
    "Event",
    "EventKind",
    "Events",
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
    "PrometheusMetrics",
    "RetryPolicy",
    "SpawnPerTask",
    "Subprocess",
    "Unfinished",
    "UnknownWorkerError",
    "Worker",
    "WorkerCrashed",
    "prometheus_metrics",
]
