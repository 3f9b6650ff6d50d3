"""Which writes concern which worker.

A worker's work can appear through a write to any table its ``eligible`` query
reads, not only its source: a parent row enabled, a prerequisite's execution
record finished. So a worker is woken by writes to every table of its query.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import Select, Table
from sqlalchemy.sql.util import find_tables

from ..core.names import table_name

log = logging.getLogger("dbworker")


@dataclass(frozen=True, slots=True)
class Watched:
    """One worker, as wake-ups see it."""

    name: str
    #: The tables whose writes may make this worker's items eligible.
    tables: frozenset[Table]

    @property
    def channel(self) -> str:
        # The execution table's name: already unique per worker and database, and a
        # valid, length-checked identifier (LISTEN takes an identifier).
        return table_name(self.name)


def watched(name: str, source: Table, eligible: Callable[[], Select[object]]) -> Watched:
    """The tables of ``eligible``'s query (and the source); the source alone if the
    query cannot be built here (its error is reported where it matters: at start)."""
    tables = {source}
    try:
        query = eligible()
        found = find_tables(query, include_joins=False, include_aliases=False)
    except Exception as exc:
        log.debug("wake-ups of worker %s watch its source only: %s", name, exc)
        return Watched(name, frozenset(tables))
    tables.update(t for t in found if isinstance(t, Table))
    return Watched(name, frozenset(tables))


def by_table(workers: Iterable[Watched]) -> dict[Table, frozenset[str]]:
    """For each watched table, the channels of the workers it wakes."""
    found: dict[Table, set[str]] = {}
    for worker in workers:
        for table in worker.tables:
            found.setdefault(table, set()).add(worker.channel)
    return {table: frozenset(channels) for table, channels in found.items()}


def dependents(workers: Iterable[Watched]) -> Mapping[str, frozenset[str]]:
    """For each worker, the workers whose ``eligible`` reads its execution table
    (``has_execution_status``): they may have new work when it completes an item."""
    chosen = list(workers)
    found: dict[str, set[str]] = {}
    for worker in chosen:
        for other in chosen:
            if other.name == worker.name:
                continue
            if any(t.name == worker.channel for t in other.tables):
                found.setdefault(worker.name, set()).add(other.name)
    return {name: frozenset(names) for name, names in found.items()}
