"""Many rows of one INSERT as one statement: a batch of endings' writes
(``invocation/together.py``).

A batch of endings writes its handlers' new rows with one INSERT. Run as an
executemany, psycopg sends a statement per row (in a pipeline), and the server runs
them one by one. As one ``INSERT ... VALUES (...), (...)`` on the driver's cursor (built
once per table, columns and number of rows, like the fenced UPDATEs), 16 rows cost the
client 0.34x the CPU on PostgreSQL through a synchronous connection and 0.52x through
the event loop's, 0.84x / 0.72x on MariaDB, 0.92x / 0.60x on SQLite
(``benchmarks.batch_insert``), and the server one statement.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Insert, bindparam

#: The most rows in one statement (each count up to it is a statement of its own,
#: compiled once per process): a bigger batch goes in several.
MOST_ROWS = 64
#: The most parameters in one statement: SQLite before 3.32 takes no more.
MOST_PARAMETERS = 999


class ManyRows:
    """``insert_rows`` (a mixin of ``Dialect``)."""

    def _built_once(
        self, key: tuple[Any, ...], build: Callable[[], Any]
    ) -> Any:  # pragma: no cover - DialectInterface provides it
        raise NotImplementedError

    def _matched(
        self, conn: Connection, key: tuple[Any, ...], statement: Any, params: dict[str, Any]
    ) -> int:  # pragma: no cover - DialectInterface provides it
        raise NotImplementedError

    def insert_rows(
        self, conn: Connection, statement: Insert, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        """Insert ``rows`` as ``conn.execute(statement, rows)`` would: each a row's
        values by column key, every row with the same keys; the columns left out get
        their defaults. No rows: nothing is run."""
        if len(rows) < 2:
            if rows:
                conn.execute(statement, rows[0])
            return
        columns = tuple(sorted(rows[0]))
        per_statement = max(1, min(MOST_ROWS, MOST_PARAMETERS // max(1, len(columns))))
        for first in range(0, len(rows), per_statement):
            chunk = rows[first : first + per_statement]
            key = ("insert_rows", statement, columns, len(chunk))
            many = self._built_once(
                key, functools.partial(_values_of, statement, columns, len(chunk))
            )
            params = {
                f"dbworker_r{i}_{j}": row[column]
                for i, row in enumerate(chunk)
                for j, column in enumerate(columns)
            }
            self._matched(conn, key, many, params)


def _values_of(statement: Insert, columns: tuple[str, ...], count: int) -> Insert:
    """``statement`` with ``count`` rows of ``columns``, each value a parameter typed as
    its column (its bind processor converts it, as SQLAlchemy's executemany would)."""
    table = statement.table
    typed = [(column, table.c[column].type) for column in columns]
    return statement.values(
        [
            {
                column: bindparam(f"dbworker_r{i}_{j}", type_=type_, required=True)
                for j, (column, type_) in enumerate(typed)
            }
            for i in range(count)
        ]
    )
