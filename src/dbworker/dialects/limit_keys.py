"""A limited worker's keys in SQL (issue 26, see ``limited.py``): as text, as stored,
held by a WORKING record, and read for each record a search returns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Select, String, Table, cast, exists, select
from sqlalchemy.sql.util import ClauseAdapter

from .terms import WorkerTable

if TYPE_CHECKING:
    from .claiming import Claiming


def key_text(expression: ColumnElement[Any]) -> ColumnElement[str]:
    """A key as text (the database's own CAST, so that equal values compare equal in
    SQL and in Python alike); ``Claiming.stored_key`` makes it what is stored."""
    return cast(expression, String())


def is_busy(worker: WorkerTable, key: ColumnElement[str]) -> ColumnElement[bool]:
    """SQL: another record of ``worker`` holds ``key`` (it is WORKING: every ending
    clears ``held_key``). Read through the unique index on ``held_key``."""
    holder = worker.table.alias("dbworker_holder")
    return exists().where(holder.c.held_key == key, holder.c.source_id != worker.source_pk)


def stored(dialect: Claiming, expression: ColumnElement[Any] | None) -> Any:
    """``expression`` as ``Claiming.stored_key`` stores it (None: no such key)."""
    return None if expression is None else dialect.stored_key(key_text(expression))


def lookup(
    worker: WorkerTable, search: Select[Any], key: ColumnElement[str], name: str
) -> ColumnElement[Any]:
    """``key`` of each record the search returns, read by the source's primary key in a
    scalar subquery (the search may hide the source table inside a lateral lookup or a
    union, and its ORDER BY stays the statement's own)."""
    source = worker.source_pk.table
    assert isinstance(source, Table)
    adapter = ClauseAdapter(source.alias(name))
    record_id = search.selected_columns[0]
    row = select(adapter.traverse(key)).where(adapter.traverse(worker.source_pk) == record_id)
    if worker.source_filter is not None:
        row = row.where(adapter.traverse(worker.source_filter))
    return row.scalar_subquery()
