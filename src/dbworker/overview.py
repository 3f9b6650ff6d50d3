"""Per-worker figures for ``dbworker status`` and the dashboard: from the coordinators'
cache when a live one refreshed it recently, else measured now (``dbworker.backlog``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from .backlog import measure
from .registry import STATS_MAX_AGE, Timing, cached_stats, has_table

if TYPE_CHECKING:
    from .coordinator import Coordinator
    from .worker import Registration


def overview(
    coordinator: Coordinator, conn: Connection, workers: Sequence[Registration], live: bool = False
) -> dict[str, dict[str, Any]]:
    """Each worker's figures, with ``age`` (seconds since measured; 0 when live) and
    ``source`` (``"live"`` or ``"cache"``)."""
    cached: dict[str, Any] = {}
    age = 0.0
    if not live:
        timing: Timing = coordinator._registry_timing
        table = coordinator._registry_table()
        found = (
            cached_stats(conn, coordinator._dialect, table, timing)
            if has_table(conn, table)
            else None
        )
        # From a live coordinator (cached_stats checks its heartbeat), which refreshes
        # them as often as their cost allows; shown with their age. Very old ones mean
        # the refresh itself fails: measuring now is better.
        if found is not None and found[1] <= STATS_MAX_AGE:
            cached, age = found
    report: dict[str, dict[str, Any]] = {}
    for worker in workers:
        figures = cached.get(worker.name)
        if figures is not None:
            report[worker.name] = {**figures, "age": age, "source": "cache"}
        else:
            report[worker.name] = {
                **measure(conn, coordinator._dialect, worker),
                "age": 0.0,
                "source": "live",
            }
    return report


def duration_text(seconds: float | None) -> str:
    """An age or a period for people: 42s, 15m, 3.5h; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
