"""``Dialect.failed_statement_aborts_transaction`` says what each database does after a
statement fails inside a transaction (the scheduler's read of rows after a claim relies
on it): PostgreSQL refuses every later statement until the transaction ends; SQLite
and MySQL/MariaDB abort the failed statement only."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, exc, text

from dbworker.dialects import for_url


def test_the_dialect_says_whether_a_failed_statement_aborts_the_transaction(
    database_url: str,
) -> None:
    dialect = for_url(database_url)
    engine = create_engine(database_url)
    dialect.configure_engine(engine)
    try:
        with engine.connect() as conn, conn.begin():
            with pytest.raises(exc.DBAPIError):
                conn.execute(text("SELECT * FROM dbworker_no_such_table"))
            try:
                conn.execute(text("SELECT 1")).scalar()
            except exc.DBAPIError:
                aborted = True
            else:
                aborted = False
    finally:
        engine.dispose()
    assert aborted is dialect.failed_statement_aborts_transaction
