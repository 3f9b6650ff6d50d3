"""``Dialect.insert_rows`` writes a batch's rows as ``conn.execute(statement, rows)``
would, as one multi-row INSERT per chunk of rows on the driver's cursor: the same rows,
the same values through the same column types, the same defaults, the same errors."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Engine,
    Integer,
    MetaData,
    Numeric,
    String,
    Table,
    create_engine,
    event,
    exc,
    insert,
    select,
)

from dbworker.dialects import for_url
from dbworker.dialects.many_rows import MOST_ROWS

META = MetaData()
WRITTEN = Table(
    "dbworker_test_many_rows",
    META,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("call_id", Integer, nullable=False, unique=True),
    Column("at", DateTime),
    Column("amount", Numeric(10, 2)),
    Column("note", String(40)),
)
DEFAULTED = Table(
    "dbworker_test_many_rows_defaulted",
    META,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("call_id", Integer, nullable=False),
    Column("kind", String(20), default="plain"),
    Column("made_by", String(20), default=lambda: "callable"),
)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    made = create_engine(database_url)
    for_url(database_url).configure_engine(made)
    META.create_all(made)
    try:
        yield made
    finally:
        META.drop_all(made)
        made.dispose()


def _rows(count: int, first: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "call_id": first + i,
            "at": datetime.datetime(2026, 12, 7, 10, i % 60, i % 59),
            "amount": decimal.Decimal(i) / 4,
            "note": None if i % 3 == 0 else f"row {i}",
        }
        for i in range(count)
    ]


def _written(conn: Connection) -> list[tuple[Any, ...]]:
    columns = (WRITTEN.c.call_id, WRITTEN.c.at, WRITTEN.c.amount, WRITTEN.c.note)
    return [tuple(row) for row in conn.execute(select(*columns).order_by(WRITTEN.c.call_id))]


@pytest.mark.parametrize("count", [0, 1, 2, 17, MOST_ROWS, 2 * MOST_ROWS + 3])
def test_the_rows_are_those_an_executemany_writes(
    database_url: str, engine: Engine, count: int
) -> None:
    dialect = for_url(database_url)
    rows = _rows(count)
    with engine.begin() as conn:
        dialect.insert_rows(conn, insert(WRITTEN), rows)
        ours = _written(conn)
        conn.execute(WRITTEN.delete())
        if rows:
            conn.execute(insert(WRITTEN), rows)
        assert ours == _written(conn)
    assert len(ours) == count
    if count >= 2:
        # Run on the driver's cursor, not through SQLAlchemy's execution by default.
        compiled = dialect._driver_forms.compiled()
        assert compiled and all(form is not None for form in compiled), compiled


def test_one_statement_per_chunk_of_rows(database_url: str, engine: Engine) -> None:
    dialect = for_url(database_url)
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            statements.append(statement)

    # A listener sees the statements (they then go through SQLAlchemy's execution).
    event.listen(engine, "before_cursor_execute", seen)
    with engine.begin() as conn:
        dialect.insert_rows(conn, insert(WRITTEN), _rows(2 * MOST_ROWS + 3))
    assert len(statements) == 3, statements
    with engine.connect() as conn:
        assert len(_written(conn)) == 2 * MOST_ROWS + 3


def test_columns_left_out_get_their_defaults(database_url: str, engine: Engine) -> None:
    dialect = for_url(database_url)
    with engine.begin() as conn:
        dialect.insert_rows(conn, insert(DEFAULTED), [{"call_id": i} for i in range(5)])
        found = conn.execute(
            select(DEFAULTED.c.call_id, DEFAULTED.c.kind, DEFAULTED.c.made_by).order_by(
                DEFAULTED.c.call_id
            )
        ).all()
    assert [tuple(row) for row in found] == [(i, "plain", "callable") for i in range(5)]


def test_a_row_that_breaks_a_constraint_fails_the_statement(
    database_url: str, engine: Engine
) -> None:
    dialect = for_url(database_url)
    rows = _rows(10)
    rows[7]["call_id"] = rows[2]["call_id"]
    with engine.connect() as conn:
        conn.begin()
        with pytest.raises(exc.IntegrityError):
            dialect.insert_rows(conn, insert(WRITTEN), rows)
        conn.rollback()
        assert _written(conn) == []
