"""Periodic workers: a schedule's slots made into ``Tick`` rows, run as any work item.

A periodic worker is a worker over the shared ticks table whose ``eligible`` query is
its own ticks; discovery reads only those (the registration's ``source_filter``). The
scheduler makes the ticks (``scheduling/ticks.py``), exactly once per slot whatever
the number of coordinators: the table's unique constraint on (worker, slot) and an
insert that ignores the duplicate, not a leader.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Select, select

from .core.schedules import Schedule
from .core.timing import RetryPolicy
from .dialects import Dialect
from .executors import ExecutorChoice
from .schema import Tick
from .worker import Handler, Registration


def ticks_of(name: str) -> Select[Any]:
    """The eligible query of periodic worker ``name``: its ticks, oldest first."""
    return select(Tick).where(Tick.worker == name).order_by(Tick.id)


def periodic_registration(
    name: str,
    handler: Handler,
    schedule: Schedule,
    *,
    concurrency: int,
    dialect: Dialect,
    timeout: float | None,
    retry: RetryPolicy | None,
    max_crashes: int,
    executor: ExecutorChoice,
) -> Registration:
    """A periodic worker's registration: a worker over its own ticks."""
    return Registration(
        name=name,
        handler=handler,
        source=Tick,
        # A partial, not a lambda: the registration stays picklable like the rest.
        eligible=functools.partial(ticks_of, name),
        concurrency=concurrency,
        dialect=dialect,
        timeout=timeout,
        retry=retry,
        max_crashes=max_crashes,
        executor=executor,
        schedule=schedule,
        source_filter=Tick.worker == name,
    )


__all__ = ["Tick", "periodic_registration", "ticks_of"]
