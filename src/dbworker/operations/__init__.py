"""The operator API: ``coordinator.operations`` and what it answers with.

What an operator needs to watch and steer workers: the coordinators registered in
the database, each worker's backlog, failed items and their retry, and the live
gauges of a running coordinator. The ``dbworker`` command, the dashboard and the
Prometheus metrics (``dbworker.operator``) are built on it alone.
"""

from .api import Operations
from .results import (
    Backlog,
    FailedRecord,
    ItemRecord,
    LimitFigures,
    LiveGauges,
    RegisteredCoordinator,
    ServedWorker,
    WorkerLoad,
)
from .schedules import ScheduleState

__all__ = [
    "Backlog",
    "FailedRecord",
    "ItemRecord",
    "LimitFigures",
    "LiveGauges",
    "Operations",
    "RegisteredCoordinator",
    "ScheduleState",
    "ServedWorker",
    "WorkerLoad",
]
