"""The scheduler: the loop, the outbox of writes that must land, the discovery and
sweep schedule, and what happens when an invocation ends; one module per idea."""

from .loop import Scheduler
from .outbox import SchedulerHealth
from .state import WorkerState

__all__ = ["Scheduler", "SchedulerHealth", "WorkerState"]
