"""Strategies for running a handler process: one interface, one module per strategy.

Executors start, watch, kill and recycle processes and move task messages; they
import only ``core`` (what runs in the processes is the coordinator's runner).
"""

from .base import ConcurrentRunner, Executor, Runner, TemplateRunner
from .strategies import (
    AsyncIO,
    ExecutorChoice,
    Inline,
    Pool,
    SpawnPerTask,
    Subprocess,
    Threads,
    chooser,
    resolve,
)

__all__ = [
    "AsyncIO",
    "ConcurrentRunner",
    "Executor",
    "ExecutorChoice",
    "Inline",
    "Pool",
    "Runner",
    "SpawnPerTask",
    "Subprocess",
    "TemplateRunner",
    "Threads",
    "chooser",
    "resolve",
]
