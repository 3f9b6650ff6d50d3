"""Discovery moves new keys into pending records in one statement where that locks none
of the application's rows: always on PostgreSQL (a plain SELECT in a CTE) and SQLite
(no row locks: the write lock a discovery holds is held either way), on MySQL /
MariaDB under READ COMMITTED (InnoDB then reads an INSERT ... SELECT's source as a
consistent read) unless the binary log is statement-based (which refuses that
statement at READ COMMITTED). Elsewhere the keys are read, then inserted.
``check_discovery_leaves_source_rows_unlocked`` (conformance) holds either way to
"no lock on the application's rows"; here, which way a discovery went.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection

from dbworker.dialects import for_url
from dbworker.dialects.mysql import _STATEMENT_BINLOG
from dbworker.testing import Harness
from dbworker.testing.models import ITEMS

from .support import statements_run


def _discover(h: Harness, conn: Connection) -> tuple[int, Any]:
    with conn.begin():
        return h.dialect.discover_to_watermark(conn, h.items)


def _sent(statements: list[str]) -> list[str]:
    """The statements other than the transaction's own BEGIN and COMMIT."""
    return [s for s in statements if not s.upper().startswith(("BEGIN", "COMMIT"))]


def _one_statement(statements: list[str]) -> bool:
    inserts = [s for s in statements if "INSERT INTO" in s.upper()]
    assert len(inserts) == 1, statements
    return "SELECT " in inserts[0] and " VALUES " not in inserts[0]


@pytest.mark.backends("postgresql", "mysql", "sqlite")
def test_a_coordinators_discovery_is_one_statement(database_url: str) -> None:
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed()
        conn = h.actor()  # the coordinator's engine options (READ COMMITTED on MySQL)
        with statements_run(conn) as seen:
            assert _discover(h, conn) == (len(ITEMS), max(row.id for row in ITEMS))
        assert _one_statement(seen)


@pytest.mark.backends("postgresql")
def test_postgresql_reads_the_watermark_inside_its_discovery(database_url: str) -> None:
    # One statement in all, from an empty table and above a watermark: a woken poll's
    # discovery is one round trip, and the watermark it reports is the one it started from.
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed()
        conn = h.actor()
        largest = max(row.id for row in ITEMS)
        for expected in ((len(ITEMS), largest), (0, largest)):
            with statements_run(conn) as seen:
                assert _discover(h, conn) == expected
            sql = _sent(seen)
            assert len(sql) == 1, sql


@pytest.mark.backends("sqlite")
def test_sqlite_reads_the_watermark_inside_its_discovery(database_url: str) -> None:
    # The INSERT reads the watermark and returns the keys it stored: a woken poll's
    # discovery is one statement; one that finds nothing then reads the watermark (an
    # idle poll: two statements, as before).
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed(items=())
        conn = h.actor()
        assert _discover(h, conn) == (0, None)
        h.add_items(1, 2, 3)
        for expected, statements in (((3, 3), 1), ((0, 3), 2)):
            with statements_run(conn) as seen:
                assert _discover(h, conn) == expected
            sql = _sent(seen)
            assert len(sql) == statements, sql
        h.add_items(7, 9)
        with statements_run(conn) as seen:
            assert _discover(h, conn) == (2, 9)
        assert len(_sent(seen)) == 1


@pytest.mark.backends("mysql")
def test_mariadb_takes_the_watermark_from_the_keys_its_discovery_returns(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watermark read, then the INSERT ... SELECT, which returns the keys it added
    # (RETURNING, MariaDB 10.5+): no second read. A key another coordinator added
    # meanwhile comes back too (ON DUPLICATE KEY UPDATE returns the row it left as it
    # was; the affected rows counted it before), and is the largest known.
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed(items=())
        conn = h.actor()
        if not conn.dialect.insert_returning:
            pytest.skip("this server has no INSERT ... RETURNING (MySQL)")
        assert _discover(h, conn) == (0, None)
        h.add_items(1, 2, 3)
        for expected, statements in (((3, 3), 2), ((0, 3), 2)):
            with statements_run(conn) as seen:
                assert _discover(h, conn) == expected
            sql = _sent(seen)
            assert len(sql) == statements, sql
        h.add_items(7, 9)
        # Another coordinator adds 9's record between this one's read of the watermark
        # (3) and its INSERT.
        read = h.dialect.watermark

        def raced(conn: Connection, worker: Any) -> Any:
            found = read(conn, worker)
            h.dialect._add_pending(conn, worker, [(9, 0.0)])
            return found

        monkeypatch.setattr(h.dialect, "watermark", raced)
        with statements_run(conn) as seen:
            assert _discover(h, conn) == (2, 9)
        monkeypatch.undo()
        assert len([s for s in seen if "INSERT" in s.upper()]) == 2, seen
        with statements_run(conn) as seen:
            assert _discover(h, conn) == (0, 9)
        assert len(_sent(seen)) == 2


@pytest.mark.backends("mysql")
def test_repeatable_read_discovers_in_two_statements(database_url: str) -> None:
    # The application's default on InnoDB: an INSERT ... SELECT would lock the source.
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed()
        conn = h.app()
        assert conn.get_isolation_level() == "REPEATABLE READ"
        with statements_run(conn) as seen:
            assert _discover(h, conn) == (len(ITEMS), max(row.id for row in ITEMS))
        assert not _one_statement(seen)


@pytest.mark.backends("mysql")
def test_the_isolation_level_is_asked_once_per_connection(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Asked at every discovery, it was a round trip of a woken poll's eight; a level
    # set through execution options is the one in force, without asking.
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed(items=())
        conn = h.actor()
        asked: list[object] = []
        real = type(conn.dialect).get_isolation_level

        def counted(dialect: Any, dbapi_connection: Any) -> Any:
            asked.append(dbapi_connection)
            return real(dialect, dbapi_connection)

        monkeypatch.setattr(type(conn.dialect), "get_isolation_level", counted)
        for first in (1, 3, 5):
            h.add_items(first, first + 1)
            with statements_run(conn) as seen:
                assert _discover(h, conn) == (2, first + 1)
            assert _one_statement(seen)
        assert len(asked) <= 1
        chosen = conn.execution_options(isolation_level="REPEATABLE READ")
        h.add_items(7)
        with statements_run(chosen) as seen:
            assert _discover(h, chosen) == (1, 7)
        assert not _one_statement(seen)
        assert len(asked) <= 1


@pytest.mark.backends("mysql")
def test_a_statement_based_binary_log_discovers_in_two_statements(database_url: str) -> None:
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        h.seed()
        conn = h.actor()
        conn.connection.info[_STATEMENT_BINLOG] = True  # as if binlog_format=STATEMENT
        with statements_run(conn) as seen:
            assert _discover(h, conn) == (len(ITEMS), max(row.id for row in ITEMS))
        assert not _one_statement(seen)
