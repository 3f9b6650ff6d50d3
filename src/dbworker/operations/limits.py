"""Each limited worker's limits and what they hold back (issue 26), counted in SQL
when asked: an operator's query, never on the claim path.

- ``key_busy``: items waiting (as ``Backlog.waiting`` counts them: eligible now and
  not claimed) whose exclusive key a WORKING record of the worker holds (its
  ``held_key``): they stay waiting until that record leaves WORKING;
- ``rate_slots_used``: the worker's rate slots stamped within the current window
  (summed over its keys with ``rate_limit_by``), out of N per key;
- ``rate_limited``: items waiting whose key (the worker's one key without
  ``rate_limit_by``) has used all N slots of the current window.

An item can be both key-busy and rate-limited: it counts in both. Keys are compared as
the claim stores them (``Claiming.stored_key``), so these agree with what claims skip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, literal, or_, select

from ..dialects import Dialect
from ..dialects.limit_keys import is_busy, key_text
from ..dialects.rate_slots import WORKER_WIDE
from ..registry import has_table
from ..worker import Registration
from .results import LimitFigures


def read_limits(
    conn: Connection, dialect: Dialect, workers: Sequence[Registration]
) -> dict[str, LimitFigures]:
    """The figures of the workers among ``workers`` that have limits."""
    now = float(conn.execute(select(dialect.now())).scalar_one())
    return {
        worker.name: _figures(conn, dialect, worker, now)
        for worker in workers
        if worker.table.limits is not None
    }


def _figures(conn: Connection, dialect: Dialect, worker: Registration, now: float) -> LimitFigures:
    limits = worker.table.limits
    assert limits is not None
    source_exists = has_table(conn, worker.table.source_pk.table)
    key_busy = rate_used = rate_limited = None
    if limits.exclusive_key is not None and source_exists:
        key = dialect.stored_key(key_text(limits.exclusive_key))
        key_busy = _waiting_where(conn, dialect, worker, is_busy(worker.table, key))
    if limits.rate is not None and limits.slots is not None:
        slots = limits.slots
        window_start = now - limits.rate.seconds
        rate_used = int(
            conn.execute(
                select(func.count()).where(
                    slots.c.worker == worker.name, slots.c.used_at > window_start
                )
            ).scalar_one()
        )
        if source_exists:
            rate_key: ColumnElement[Any] = (
                literal(WORKER_WIDE)
                if limits.rate_key is None
                else dialect.stored_key(key_text(limits.rate_key))
            )
            used = (
                select(func.count())
                .where(
                    slots.c.worker == worker.name,
                    slots.c.rate_key == rate_key,
                    slots.c.used_at > window_start,
                )
                .scalar_subquery()
            )
            rate_limited = _waiting_where(conn, dialect, worker, used >= limits.rate.count)
    return LimitFigures(
        worker=worker.name,
        exclusive_by=None if limits.exclusive_key is None else str(limits.exclusive_key),
        rate_limit=None if limits.rate is None else str(limits.rate),
        rate_limit_by=None if limits.rate_key is None else str(limits.rate_key),
        key_busy=key_busy,
        rate_slots_used=rate_used,
        rate_slots=None if limits.rate is None else limits.rate.count,
        rate_limited=rate_limited,
        measured_at=now,
    )


def _waiting_where(
    conn: Connection, dialect: Dialect, worker: Registration, condition: ColumnElement[bool]
) -> int:
    """Items eligible now and not claimed (``backlog.waiting``'s) that meet ``condition``,
    an expression of the source table's row."""
    query = worker.eligible_query()
    if query._limit_clause is None and query._offset_clause is None:
        query = query.order_by(None)
    eligible = query.where(condition).subquery("dbworker_eligible")
    key = eligible.c[worker.table.source_pk.name]
    table = worker.table.table
    statement = (
        select(func.count())
        .select_from(eligible.outerjoin(table, table.c.source_id == key))
        .where(or_(table.c.source_id.is_(None), dialect.claimable(table, dialect.now())))
    )
    return int(conn.execute(statement).scalar_one())
