"""Statements compiled once and run on the driver's own cursor.

A handler process runs two statements of its own per item: the read of its source row
by key and the fenced UPDATE. Through SQLAlchemy's execution (compiled-cache lookup,
execution context, result set-up) the UPDATE cost 52 / 83 / 77 µs of client CPU per item
on SQLite / PostgreSQL / MariaDB, on the driver's cursor 35 / 61 / 51
(`benchmarks.child_path`); the read, in a slow spell of the machine, 198 / 147 µs on
PostgreSQL / MariaDB against 70 / 66 on a cursor kept with the driver connection (a new
psycopg cursor for each statement cost 30 µs more). What SQLAlchemy's path gives that
matters here is kept: the statement runs in SQLAlchemy's transaction (begun if there is
none, as its autobegin would), the driver's errors come back as SQLAlchemy's
exceptions, a lost connection is invalidated, and a row's values go through their
column types' result processors. Whoever watches statements (``echo``, cursor-execute
or error listeners, a schema translation map) gets SQLAlchemy's path, so sees them all.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
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
    #: The compiled name of each parameter given by its key where the two differ (an
    #: anonymous parameter: a statement built once from an eligible query, run with
    #: each query's values, as SQLAlchemy's own execution maps them).
    renames: Mapping[str, str] = field(default_factory=dict)
    #: The result processors of a SELECT's columns, by the driver's column types.
    _results: dict[tuple[Any, ...], tuple[Any, ...]] = field(default_factory=dict, compare=False)

    @classmethod
    def compile(cls, statement: Any, dialect: SADialect) -> DriverStatement | None:
        """``statement`` compiled for ``dialect``, or None when its parameters need
        SQLAlchemy at execution time (rendered after compilation, escaped names, column
        defaults it computes, or input sizes the driver must be told)."""
        if dialect.bind_typing is BindTyping.SETINPUTSIZES:
            return None
        compiled = statement.compile(dialect=dialect)
        if not isinstance(compiled, SQLCompiler):
            return None
        if (
            compiled.post_compile_params
            or compiled.literal_execute_params
            or compiled.escaped_bind_names
            # Column defaults computed in Python at each execution (an INSERT's).
            or compiled.insert_prefetch
            or compiled.update_prefetch
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
        renames = {b.key: name for name, b in compiled.binds.items() if b.key != name}
        return cls(statement, compiled.string, order, fixed, processors, renames)

    def result_processors(
        self, dialect: SADialect, driver_types: tuple[Any, ...]
    ) -> tuple[Any, ...]:
        """Each selected column's result processor (or None), as SQLAlchemy's result
        set-up chooses it: from the column's type and the type the driver reports."""
        processors = self._results.get(driver_types)
        if processors is None:
            # A SELECT's columns, or an UPDATE's RETURNING.
            columns = self.statement.exported_columns  # type: ignore[attr-defined]
            processors = tuple(
                column.type.dialect_impl(dialect).result_processor(dialect, driver_type)
                for column, driver_type in zip(columns, driver_types, strict=True)
            )
            self._results[driver_types] = processors
        return processors

    def parameters(self, params: Mapping[str, Any]) -> Any:
        renames = self.renames
        if renames:
            values = dict(self.fixed)
            for key, value in params.items():
                values[renames.get(key, key)] = value
        else:
            values = {**self.fixed, **params}
        for name, processor in self.processors.items():
            values[name] = processor(values[name])
        if self.order is None:
            return values
        return tuple([values[name] for name in self.order])


class DriverForms:
    """Statements' driver forms, compiled once per key and SQLAlchemy dialect."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[Any, SADialect], DriverStatement | None] = {}

    def get(self, conn: Connection, key: Any, statement: Any) -> DriverStatement | None:
        """``statement``'s driver form for ``conn``, or None when it must go through
        SQLAlchemy's execution (someone watches statements, or it has no such form)."""
        if watched(conn):
            return None
        compiled_for = (key, conn.dialect)
        try:
            return self._compiled[compiled_for]
        except KeyError:
            driver = self._compiled[compiled_for] = DriverStatement.compile(statement, conn.dialect)
            return driver

    def compiled(self) -> list[DriverStatement | None]:
        return list(self._compiled.values())


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
    cursor = _execute(conn, statement, params)
    if cursor is None:  # invalidated: SQLAlchemy's path reconnects or says why
        return int(conn.execute(statement.statement, params).rowcount)
    return int(cursor.rowcount)


def first_row(
    conn: Connection, statement: DriverStatement, params: Mapping[str, Any], alone: bool = False
) -> tuple[Any, ...] | None:
    """Run the SELECT ``statement`` on ``conn``'s driver connection; its first row, as
    SQLAlchemy would give it (each value through its column type's result processor).

    ``alone``: outside any transaction (a driver connection in autocommit, as dbworker's
    SQLite connections are, reads one statement consistently by itself): no BEGIN and
    no COMMIT around it, and ``conn`` is left with no transaction."""
    cursor = _execute(conn, statement, params, begin=not alone)
    if cursor is None:
        row = conn.execute(statement.statement, params).first()
        if alone:
            conn.rollback()
        return None if row is None else tuple(row)
    # All of them: an unfinished statement would keep its cursor (and, on SQLite, its
    # read) open until the next one.
    rows = cursor.fetchall()
    return _converted(conn, statement, cursor, rows[:1])[0] if rows else None


def all_rows(
    conn: Connection, statement: DriverStatement, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """Run the SELECT ``statement`` on ``conn``'s driver connection, in its transaction;
    every row, as SQLAlchemy would give it."""
    cursor = _execute(conn, statement, params)
    if cursor is None:
        return [tuple(row) for row in conn.execute(statement.statement, params)]
    return _converted(conn, statement, cursor, cursor.fetchall())


def _driver_types(cursor: Any) -> tuple[Any, ...]:
    """The type code of each column of ``cursor``'s result, as its description gives it."""
    result = getattr(cursor, "pgresult", None)
    if result is not None:
        # psycopg 3: the description makes a Column object per column at each call
        # (12 us for ten columns); the result's own type codes are the same values.
        return tuple(map(result.ftype, range(result.nfields)))
    return tuple(column[1] for column in cursor.description)


def _converted(
    conn: Connection, statement: DriverStatement, cursor: Any, rows: list[Any]
) -> list[tuple[Any, ...]]:
    """``rows`` with each value through its column type's result processor."""
    if not rows:
        return []
    processors = statement.result_processors(conn.dialect, _driver_types(cursor))
    if not any(processors):
        return [tuple(row) for row in rows]
    return [
        tuple(
            value if process is None else process(value)
            for value, process in zip(row, processors, strict=True)
        )
        for row in rows
    ]


@contextlib.contextmanager
def statements_alone(conn: Connection) -> Iterator[None]:
    """Within it, statements on ``conn``'s driver cursor begin no transaction: the
    driver connection commits each one by itself (it autocommits, as dbworker's SQLite
    connections do). Through SQLAlchemy's execution a statement still begins one."""
    conn.info[_ALONE] = True
    try:
        yield
    finally:
        conn.info.pop(_ALONE, None)


def run_plain(conn: Connection, sql: str) -> None:
    """Run ``sql`` (no parameters, no rows: a SAVEPOINT) on the cursor kept with
    ``conn``'s driver connection, in its transaction; through SQLAlchemy when the
    connection was invalidated."""
    cursor = _execute(conn, _Plain(sql), {}, begin=False)
    if cursor is None:
        conn.exec_driver_sql(sql)


@dataclass(frozen=True, slots=True)
class _Plain:
    """A parameterless statement in ``_execute``'s terms."""

    sql: str

    def parameters(self, params: Mapping[str, Any]) -> Any:
        return ()


def _execute(
    conn: Connection,
    statement: DriverStatement | _Plain,
    params: Mapping[str, Any],
    begin: bool = True,
) -> Any:
    """``statement`` executed on the cursor kept with ``conn``'s driver connection, or
    None when that connection was invalidated."""
    if begin and not conn.in_transaction() and not conn.info.get(_ALONE):
        conn.begin()  # as SQLAlchemy's autobegin: the caller's commit covers the statement
    dialect = conn.dialect
    pooled = conn.connection
    dbapi_connection = pooled.dbapi_connection
    if dbapi_connection is None:
        return None
    # Kept in the connection's info, which SQLAlchemy clears when it replaces the
    # driver connection: a cursor never outlives the connection it was made on.
    cursor = pooled.info.get(_CURSOR)
    if cursor is None:
        cursor = pooled.info[_CURSOR] = dbapi_connection.cursor()
    args = statement.parameters(params)
    try:
        cursor.execute(statement.sql, args)
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
    return cursor


_CURSOR = "dbworker_driver_cursor"
#: In a connection's info: ``statements_alone`` is in force.
_ALONE = "dbworker_statements_alone"
