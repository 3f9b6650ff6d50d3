"""A parting's writes without the ORM's unit of work, where nothing would differ.

An I/O-bound handler typically ends by adding a row or two (a log of the call, its
result) and returns. Ending together (``together.py``), each parting's session is
flushed in its own savepoint, and the flush was most of an ending's CPU: about 0.46 of
0.6 ms of the handler process's one core per ending (``benchmarks.io``: a wave of 50
endings queues for that core, and the last wave's endings were most of the time the
drain took beyond Celery's).

Where the session holds nothing but new objects of one plain mapping (a table of its
own, column attributes only: ``loading.py``'s criteria, and no relationships, no
version counter), and nobody listens for what a flush does (session events, mapper
insert events), those objects are written with one Core ``INSERT`` each, in insert
order, on the batch's connection: the rows the ORM's flush would write (the same
columns, the same defaults, the same type processing). Anything else takes the ORM's
flush. Nothing reads the objects afterwards: the session is closed once its batch
commits, and they are left as the handler made them (no primary key filled in).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Insert, Table, insert, inspect
from sqlalchemy.orm import Mapper, Session
from sqlalchemy.sql import ClauseElement

from .loading import plain_columns
from .session import listened

#: Session events a flush or its commit fires: with one listening, only the ORM's flush
#: is the same.
_SESSION_HOOKS = (
    "before_flush",
    "after_flush",
    "after_flush_postexec",
    "after_begin",
    "before_commit",
    "after_commit",
    "after_transaction_create",
    "after_transaction_end",
    "pending_to_persistent",
)
#: Mapper events an insert fires.
_MAPPER_HOOKS = ("before_insert", "after_insert")


class PlainInserts:
    """Per process: which mappings' new objects may be inserted plainly."""

    def __init__(self) -> None:
        self._plans: dict[Mapper[Any], _Plan | None] = {}

    def rows(self, session: Session) -> tuple[Insert, list[dict[str, Any]]] | None:
        """The INSERT and its rows that write ``session``'s new objects, if nothing
        would differ from the ORM's flush (no rows: nothing to write); else None."""
        if session.dirty or session.deleted or _hooked(session):
            return None
        states = sorted((inspect(obj) for obj in session.new), key=lambda s: s.insert_order)
        if not states:
            return None  # nothing to flush: the ORM's flush costs nothing then
        mapper = states[0].mapper
        if any(state.mapper is not mapper for state in states):
            return None  # the ORM orders several tables' inserts by their dependencies
        plan = self._plan(mapper)
        if plan is None:
            return None
        rows = []
        for state in states:
            row = plan.row(state.dict)
            if row is None:
                return None
            rows.append(row)
        return plan.statement, rows

    def _plan(self, mapper: Mapper[Any]) -> _Plan | None:
        if mapper not in self._plans:
            self._plans[mapper] = _Plan.of(mapper)
        plan = self._plans[mapper]
        # Listeners may be added at any time: checked at each write.
        if plan is None or listened(mapper.dispatch, _MAPPER_HOOKS):
            return None
        return plan


class _Plan:
    """How one plain mapping's object becomes the parameters of its INSERT."""

    def __init__(self, table: Table, keys: list[tuple[str, str, bool]]) -> None:
        self.statement: Insert = insert(table)
        #: (attribute key, column key, whether an unset value is written as NULL) of
        #: each column: as the ORM does for a column with no default that is not in
        #: the primary key (an omitted one with no default is an error on MariaDB,
        #: "doesn't have a default value", where NULL is "cannot be null").
        self.keys = keys

    @classmethod
    def of(cls, mapper: Mapper[Any]) -> _Plan | None:
        columns = plain_columns(mapper)
        table = mapper.local_table
        if (
            columns is None
            or not isinstance(table, Table)
            or mapper.relationships
            or mapper.version_id_col is not None
            # A type that writes None as something else: the ORM includes it, and sets
            # an unset column to None itself.
            or any(column.type.should_evaluate_none for column in columns)
        ):
            return None
        keys = [
            (
                mapper.get_property_by_column(column).key,
                column.key,
                not (column.primary_key or column.server_default or column.default),
            )
            for column in columns
        ]
        return cls(table, keys)

    def row(self, values: dict[str, Any]) -> dict[str, Any] | None:
        """The INSERT's parameters for an object's attribute ``values``, as the ORM
        collects them: each attribute set but to None; a column left unset (or None)
        gets its default, or NULL if it has none and is not in the primary key. None
        when a value is a SQL expression (the ORM renders it inline)."""
        row: dict[str, Any] = {}
        for attribute, column, as_null in self.keys:
            value = values.get(attribute)
            if value is None:
                if as_null:
                    row[column] = None
                continue
            if isinstance(value, ClauseElement) or hasattr(value, "__clause_element__"):
                return None
            row[column] = value
        return row


def _hooked(session: Session) -> bool:
    return listened(session.dispatch, _SESSION_HOOKS)
