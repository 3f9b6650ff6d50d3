"""Strategies for running a handler: one interface, one module per strategy."""

from .base import ChildConfig, Executor, Result, ResultKind, Task
from .pool import ProcessPool

__all__ = ["ChildConfig", "Executor", "ProcessPool", "Result", "ResultKind", "Task"]
