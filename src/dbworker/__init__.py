"""dbworker: background work in process workers, coordinated through your SQL database."""

from .coordinator import Coordinator
from .core.errors import (
    Cancelled,
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
from .executors import AsyncIO, Inline, Pool, SpawnPerTask, Subprocess, Threads
from .health import Health
from .operations import (
    Backlog,
    FailedRecord,
    ItemRecord,
    LimitFigures,
    LiveGauges,
    Operations,
    RegisteredCoordinator,
    ScheduleState,
    ServedWorker,
    WorkerLoad,
)
from .operator.metrics import PrometheusMetrics, prometheus_metrics
from .records import ExecutionState, FailedItem
from .schema import Tick
from .worker import Worker

__all__ = [
    "AsyncIO",
    "Backlog",
    "Cancelled",
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
    "FailedRecord",
    "Finished",
    "HandlerContractError",
    "HandlerTimeout",
    "Health",
    "Inline",
    "ItemRecord",
    "LimitFigures",
    "LiveGauges",
    "Operations",
    "Outcome",
    "Pool",
    "PrometheusMetrics",
    "RegisteredCoordinator",
    "RetryPolicy",
    "ScheduleState",
    "ServedWorker",
    "SpawnPerTask",
    "Subprocess",
    "Threads",
    "Tick",
    "Unfinished",
    "UnknownWorkerError",
    "Worker",
    "WorkerCrashed",
    "WorkerLoad",
    "prometheus_metrics",
]
