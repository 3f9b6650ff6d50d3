"""The gauges read from a running scheduler: per worker, handlers running and claims
held. Read from another thread (a metrics scrape) while the scheduler changes them,
so by copies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..executors import Executor
    from ..scheduling import Scheduler


def running_and_held(scheduler: Scheduler | None) -> dict[str, tuple[int, int]]:
    """Per worker: (handlers running, claims held); empty when nothing runs."""
    if scheduler is None:
        return {}
    counts = {}
    for name, state in scheduler.states.items():
        for _ in range(3):  # the scheduler resized the dict mid-copy: copy again
            try:
                held = list(state.held.items())
                break
            except RuntimeError:
                held = []
        executor = state.executor
        running = sum(_has_started(executor, (name, key, h.token)) for key, h in held)
        counts[name] = (running, len(held))
    return counts


def _has_started(executor: Executor, key: tuple[str, Any, int]) -> bool:
    # Executors are the scheduling thread's: a task ending mid-read (its queue
    # emptied between a length check and an index) only means it is not running.
    try:
        return executor.started(key) is not None
    except (IndexError, RuntimeError, KeyError):
        return False
