"""Statements compiled once and run on the driver's own cursor.

A handler process runs one fenced UPDATE per item. Through SQLAlchemy's execution
(compiled-cache lookup, execution context, result set-up) that UPDATE cost 52 / 83 /
77 µs of client CPU per item on SQLite / PostgreSQL / MariaDB, on the driver's cursor
35 / 61 / 51 (`benchmarks.child_path`). What SQLAlchemy's path gives that matters here is kept:
the statement runs in SQLAlchemy's transaction (begun if there is none, as its
autobegin would), the driver's errors come back as SQLAlchemy's exceptions, and a lost
connection is invalidated. Whoever watches statements (``echo``, cursor-execute or
error listeners, a schema translation map) gets SQLAlchemy's path, so sees them all.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.engine.interfaces import BindTyping
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import Executable


@dataclass(frozen=True, slots=True)
class DriverStatement:
    """One statement as its driver takes it: SQL text, parameter order, conversions."""

    statement: Executable
    sql: str
    #: The parameters' order for a positional paramstyle; None: passed by name.
    order: tuple[str, ...] | None
    #: The values of the parameters the statement carries itself.
    fixed: Mapping[str, Any]
    processors: Mapping[str, Callable[[Any], Any]]

    @classmethod
    def compile(cls, statement: Any, dialect: SADialect) -> DriverStatement | None:
        """``statement`` compiled for ``dialect``, or None when its parameters need
        SQLAlchemy at execution time (rendered after compilation, escaped names, or
        input sizes the driver must be told)."""
        if dialect.bind_typing is BindTyping.SETINPUTSIZES:
            return None
        compiled = statement.compile(dialect=dialect)
        if not isinstance(compiled, SQLCompiler):
            return None
        if (
            compiled.post_compile_params
            or compiled.literal_execute_params
            or compiled.escaped_bind_names
        ):
            return None
        fixed: dict[str, Any] = {}
        processors: dict[str, Callable[[Any], Any]] = {}
        for name, bind in compiled.binds.items():
            if bind.callable is not None:
                return None  # its value is computed at each execution
            if not bind.required:
                fixed[name] = bind.value  # a literal of the statement (e.g. in its clock)
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                processors[name] = processor
        order = tuple(compiled.positiontup or ()) if compiled.positional else None
        return cls(statement, compiled.string, order, fixed, processors)

    def parameters(self, params: Mapping[str, Any]) -> Any:
        values = {**self.fixed, **params}
        for name, processor in self.processors.items():
            values[name] = processor(values[name])
        if self.order is None:
            return values
        return tuple([values[name] for name in self.order])


def watched(conn: Connection) -> bool:
    """Whether anyone would miss a statement that bypassed SQLAlchemy's execution."""
    dispatch = conn.dispatch
    return bool(
        dispatch.before_cursor_execute
        or dispatch.after_cursor_execute
        or conn.dialect.dispatch.handle_error
        or conn.engine.logger.isEnabledFor(logging.INFO)
        or conn.get_execution_options().get("schema_translate_map")
    )


def rowcount(conn: Connection, statement: DriverStatement, params: Mapping[str, Any]) -> int:
    """Run ``statement`` on ``conn``'s driver connection; the rows it matched."""
    if not conn.in_transaction():
        conn.begin()  # as SQLAlchemy's autobegin: the caller's commit covers the statement
    dialect = conn.dialect
    dbapi_connection = conn.connection.dbapi_connection
    if dbapi_connection is None:  # invalidated: SQLAlchemy's path reconnects or says why
        return int(conn.execute(statement.statement, params).rowcount)
    args = statement.parameters(params)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(statement.sql, args)
        return int(cursor.rowcount)
    except dialect.loaded_dbapi.Error as exc:
        lost = dialect.is_disconnect(exc, dbapi_connection, cursor)
        error = DBAPIError.instance(
            statement.sql,
            args,
            exc,
            dialect.loaded_dbapi.Error,
            connection_invalidated=lost,
            dialect=dialect,
        )
        if lost:
            conn.invalidate(error)
        raise error from exc
    finally:
        with contextlib.suppress(Exception):
            cursor.close()
