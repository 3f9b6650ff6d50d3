"""Strategies for running a handler: one interface, one module per strategy."""

from .base import ChildConfig, Executor, Result, ResultKind, Task
from .strategies import ExecutorChoice, Inline, Pool, SpawnPerTask, Subprocess, resolve

__all__ = [
    "ChildConfig",
    "Executor",
    "ExecutorChoice",
    "Inline",
    "Pool",
    "Result",
    "ResultKind",
    "SpawnPerTask",
    "Subprocess",
    "Task",
    "resolve",
]
