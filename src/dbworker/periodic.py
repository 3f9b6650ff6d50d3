"""Periodic workers: a schedule's slots made into ``Tick`` rows, run as any work item.

A periodic worker is a worker over the shared ticks table whose ``eligible`` query is
its own ticks; discovery reads only those (the registration's ``source_filter``). The
scheduler makes the ticks (``scheduling/ticks.py``), exactly once per slot whatever
the number of coordinators: the table's unique constraint on (worker, slot) and an
insert that ignores the duplicate, not a leader.
"""

from __future__ import annotations

import functools
from typing import Any, cast

from sqlalchemy import Select, select

from .core.errors import ConfigurationError
from .core.schedules import Schedule
from .core.timing import RetryPolicy
from .dialects import Dialect
from .executors import ExecutorChoice
from .limit_options import check_limits
from .schema import TICKS, Tick
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
    limits: tuple[Any, str | None] = (None, None),
) -> Registration:
    """A periodic worker's registration: a worker over its own ticks; ``limits`` is
    ``periodic_limits``'s (exclusive_by, rate_limit)."""
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
        # Exclusive: the key is the worker's own name, the same for all its ticks.
        exclusive_by=limits[0],
        rate_limit=limits[1],
    )


def periodic_limits(exclusive: object, rate_limit: object) -> tuple[Any, str | None]:
    """A periodic worker's (exclusive_by, rate_limit), checked: ``exclusive`` makes its
    ticks one key (no two run at once); a rate limit is worker-wide."""
    if not isinstance(exclusive, bool):
        raise ConfigurationError(f"exclusive must be True or False, got {exclusive!r}")
    key = Tick.worker if exclusive else None
    check_limits(TICKS, key, rate_limit)
    return key, cast(str | None, rate_limit)


__all__ = ["Tick", "periodic_limits", "periodic_registration", "ticks_of"]
