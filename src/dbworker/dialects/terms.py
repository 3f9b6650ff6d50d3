"""The terms every dialect module shares: a worker's table, the test clock, what a claim
returns and who holds it, literal statuses and the token no claim ever issues."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Table,
    bindparam,
    literal_column,
)
from sqlalchemy.exc import IntegrityError

from ..core.errors import ClaimContention
from ..core.limits import Rate
from ..core.status import Phase

#: Claims are numbered from 1, so no fenced statement under this token matches a row.
NEVER_ISSUED_TOKEN = -1
#: What discovery sets in a new pending record (the other columns take their defaults).
PENDING_COLUMNS = (
    "source_id",
    "status",
    "token",
    "attempts",
    "failures",
    "crashes",
    "discovered_at",
    "updated_at",
)
#: An execution option marking a connection whose transaction only reads.
READ_ONLY_OPTION = "dbworker_read_only"
#: A clock for tests: seconds since the epoch. Production reads the database's clock.
Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Limits:
    """A worker's per-key limits (issue 26), as SQL over its source table.

    ``exclusive_key``: no two WORKING records of the worker with equal values (the
    execution table's ``held_key``, under a unique index). ``rate``: at most
    ``rate.count`` claims in any ``rate.seconds``, per value of ``rate_key`` if given.
    A NULL key is nobody's: such rows are neither exclusive nor limited per key.
    """

    exclusive_key: ColumnElement[Any] | None = None
    rate: Rate | None = None
    rate_key: ColumnElement[Any] | None = None
    #: The rate limits' slots table (``schema.rate_slots_table``), when ``rate`` is set.
    slots: Table | None = None

    @property
    def keyed(self) -> bool:
        return self.exclusive_key is not None


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerTable:
    """What a dialect needs to know about one worker: its table and its source's key."""

    name: str
    table: Table
    source_pk: ColumnElement[Any]
    #: Integer keys grow with inserts, so new rows can be found above a watermark.
    monotonic_keys: bool
    #: Which rows of the source table are this worker's (a periodic worker's ticks in
    #: the shared ticks table); discovery, sweeps and the probe look at those alone.
    source_filter: ColumnElement[bool] | None = None
    #: Exclusivity and rate limits; None (most workers) claims as it always did.
    limits: Limits | None = None

    def own(self, query: Select[Any]) -> Select[Any]:
        """``query`` over the source table, narrowed to this worker's rows."""
        return query if self.source_filter is None else query.where(self.source_filter)


def status_literal(phase: Phase) -> ColumnElement[str]:
    # Literal (not bound) status values let planners match the partial index's
    # predicate even in prepared, generic plans.
    return literal_column(f"'{phase.value}'")


def status_in(column: ColumnElement[str], phases: Iterable[Phase]) -> ColumnElement[bool]:
    return column.in_([status_literal(p) for p in sorted(phases)])


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    source_id: Any
    token: int
    attempts: int
    failures: int
    crashes: int
    #: The record's status as locked (a claim of a WORKING record is a takeover).
    status: str | None = None


class Claims(list[Claim]):
    """What a claim took, and how many records it found claimable but could not lock.

    Another transaction held those (on MySQL, a concurrent discovery's insert of the
    same keys locks them until it commits): they are claimable again in a moment, and
    the caller should look again soon rather than at its next poll. A dialect that
    cannot tell (one statement searches and locks) reports none.
    """

    skipped: int = 0

    @classmethod
    def of(cls, claims: Iterable[Claim], skipped: int = 0) -> Claims:
        made = cls(claims)
        made.skipped = skipped
        return made


@dataclasses.dataclass(frozen=True, slots=True)
class Owner:
    host: str
    pid: int

    @classmethod
    def current(cls) -> Owner:
        return cls(socket.gethostname()[:255], os.getpid())


def claim_columns(table: Table) -> tuple[ColumnElement[Any], ...]:
    """What a claim reads of each record: the fields of ``Claim``, in order."""
    c = table.c
    return (c.source_id, c.token, c.attempts, c.failures, c.crashes, c.status)


def keys_in(table: Table, count: int | None) -> ColumnElement[bool]:
    """``table``'s source id in the list parameter ``ids`` (``count`` None), or in
    ``count`` parameters named by position (``by_position``): a statement built once
    per count runs on the driver's cursor, where an expanding IN would be rendered anew
    for every execution."""
    source_id = table.c.source_id
    if count is None:
        return source_id.in_(bindparam("ids", expanding=True))
    return source_id.in_(
        [bindparam(f"dbworker_key_{i}", type_=source_id.type) for i in range(count)]
    )


def by_position(keys: Sequence[Any]) -> dict[str, Any]:
    """The parameters of ``keys_in(table, len(keys))`` for ``keys``, in order."""
    return {f"dbworker_key_{i}": key for i, key in enumerate(keys)}


def epoch_to_datetime(value: float | None) -> dt.datetime | None:
    if value is None:
        return None
    return dt.datetime.fromtimestamp(float(value), tz=dt.UTC)


def keyed_rows(
    conn: Connection,
    statement: Any,
    params: Any,
    worker: str,
    run: Callable[[Connection, Any, Any, Any], list[Any]] | None = None,
) -> list[Any]:
    """``statement``'s rows (through ``run(conn, statement, statement, params)`` if
    given): a claim that writes held keys, where a key another claim took since the
    search fails at the unique index and loses the transaction (PostgreSQL):
    ``ClaimContention``, and the loop claims again in a moment."""
    try:
        if run is not None:
            return run(conn, statement, statement, params)
        return list(conn.execute(statement, params).all())
    except IntegrityError as exc:
        raise ClaimContention(f"a key of worker={worker} was just taken by another claim") from exc
