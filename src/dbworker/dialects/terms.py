"""The terms every dialect module shares: a worker's table, the test clock, literal
statuses and the token no claim ever issues."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import ColumnElement, Table, literal_column

from ..core.status import Phase

#: Claims are numbered from 1, so no fenced statement under this token matches a row.
NEVER_ISSUED_TOKEN = -1
#: A clock for tests: seconds since the epoch. Production reads the database's clock.
Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerTable:
    """What a dialect needs to know about one worker: its table and its source's key."""

    name: str
    table: Table
    source_pk: ColumnElement[Any]
    #: Integer keys grow with inserts, so new rows can be found above a watermark.
    monotonic_keys: bool


def status_literal(phase: Phase) -> ColumnElement[str]:
    # Literal (not bound) status values let planners match the partial index's
    # predicate even in prepared, generic plans.
    return literal_column(f"'{phase.value}'")


def status_in(column: ColumnElement[str], phases: Iterable[Phase]) -> ColumnElement[bool]:
    return column.in_([status_literal(p) for p in sorted(phases)])
