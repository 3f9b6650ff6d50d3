"""Strategies for running a handler process: one interface, one module per strategy.

Executors start, watch, kill and recycle processes and move task messages; they
import only ``core`` (what runs in the processes is the coordinator's runner).
"""

from .base import Executor, Runner, TemplateRunner
from .strategies import ExecutorChoice, Inline, Pool, SpawnPerTask, Subprocess, resolve

__all__ = [
    "Executor",
    "ExecutorChoice",
    "Inline",
    "Pool",
    "Runner",
    "SpawnPerTask",
    "Subprocess",
    "TemplateRunner",
    "resolve",
]
