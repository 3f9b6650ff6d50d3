"""Each worker's backlog: from the coordinators' cache when a live one refreshed it
recently, else measured now (``dbworker.backlog``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table

from ..backlog import measure
from ..core.status import Phase
from ..dialects import Dialect
from ..registry import STATS_MAX_AGE, Timing, cached_stats, has_table
from ..worker import Registration
from .results import Backlog


def read_backlog(
    conn: Connection,
    dialect: Dialect,
    workers: Sequence[Registration],
    registry: Table | None,
    timing: Timing,
) -> dict[str, Backlog]:
    """The figures of ``workers``, measured now unless ``registry`` holds a recent
    count (None: count now whatever it holds)."""
    cached: Mapping[str, Any] = {}
    age = 0.0
    if registry is not None:
        found = cached_stats(conn, dialect, registry, timing) if has_table(conn, registry) else None
        # From a live coordinator (cached_stats checks its heartbeat), which refreshes
        # them as often as their cost allows; shown with their age. Very old ones mean
        # the refresh itself fails: measuring now is better.
        if found is not None and found[1] <= STATS_MAX_AGE:
            cached, age = found
    report: dict[str, Backlog] = {}
    for worker in workers:
        figures = cached.get(worker.name)
        if figures is not None:
            report[worker.name] = backlog_of(worker.name, figures, age, cached=True)
        else:
            figures = measure(conn, dialect, worker)
            report[worker.name] = backlog_of(worker.name, figures, 0.0, cached=False)
    return report


def backlog_of(name: str, figures: Mapping[str, Any], age: float, cached: bool) -> Backlog:
    """``figures`` (``dbworker.backlog.measure``'s, or as the registry keeps them in
    JSON) as a Backlog."""
    return Backlog(
        worker=name,
        counts={Phase(phase).public: int(n) for phase, n in figures["counts"].items()},
        waiting=figures["waiting"],
        oldest_waiting_seconds=figures["oldest_waiting_seconds"],
        running=figures["running"],
        finished_last_minute=figures["finished_last_minute"],
        history=tuple(figures["history"]),
        measured_at=figures["measured_at"],
        age=age,
        cached=cached,
    )
