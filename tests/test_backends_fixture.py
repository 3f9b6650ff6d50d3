"""Proves the contract of the database fixtures in conftest.py, on every backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import settings
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import NullPool

from backends import as_pymysql, with_driver


@contextmanager
def connected(url: str) -> Iterator[Engine]:
    # NullPool + dispose: these tests must not leave connections behind themselves, or
    # test_fixture_holds_no_connections could not tell whose connection it saw.
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


def _visible_objects(engine: Engine) -> list[str]:
    inspector = sa.inspect(engine)
    return sorted(inspector.get_table_names() + inspector.get_view_names())


def _create_and_fill(engine: Engine, table_name: str) -> sa.Table:
    metadata = sa.MetaData()
    table = sa.Table(
        table_name,
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(50), nullable=False),
    )
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"id": 1, "name": "alpha"}, {"id": 2, "name": "beta"}])
    return table


def test_database_is_empty_and_writable(database_url: str) -> None:
    with connected(database_url) as engine:
        assert _visible_objects(engine) == []
        table = _create_and_fill(engine, "items")
        with engine.connect() as conn:
            rows = conn.execute(sa.select(table.c.id, table.c.name).order_by(table.c.id)).all()
        assert [tuple(row) for row in rows] == [(1, "alpha"), (2, "beta")]
        # The table is deliberately left behind: the isolation tests below rely on
        # every test in this module leaving litter for the fixture to clean up.


@pytest.mark.parametrize("round_no", [1, 2, 3])
def test_tests_do_not_see_each_others_tables(database_url: str, round_no: int) -> None:
    # Each item asserts an empty start and leaves a table behind. With four littering
    # items per backend (these three plus test_database_is_empty_and_writable) and at
    # most two xdist workers, at least two of them run on one worker, i.e. in one server
    # database (see test_server_database_is_per_process), so a missing reset would fail.
    with connected(database_url) as engine:
        assert _visible_objects(engine) == []
        _create_and_fill(engine, f"leftover_{round_no}")
        assert _visible_objects(engine) == [f"leftover_{round_no}"]


@pytest.mark.backends("postgresql", "mysql")
def test_server_database_is_per_process(database_url: str) -> None:
    name = make_url(database_url).database
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert name is not None
    assert name.startswith(f"dbw_{worker}_{os.getpid()}_")


@pytest.mark.backends("postgresql", "mysql")
def test_fixture_holds_no_connections(database_url: str, backend: str) -> None:
    # A connection kept by the fixture would block DROP DATABASE at session end and
    # would skew any test that counts or waits for connections.
    if backend == "postgresql":
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    else:
        query = "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()"
    with connected(database_url) as engine, engine.connect() as conn:
        assert conn.exec_driver_sql(query).scalar() == 1  # this connection only


@pytest.mark.backends("sqlite")
def test_sqlite_database_is_a_fresh_file_in_tmp_path(database_url: str, tmp_path: Path) -> None:
    path = make_url(database_url).database
    assert path is not None
    assert Path(path).parent == tmp_path
    assert not Path(path).exists()


@pytest.mark.backends("postgresql", "mysql")
def test_backends_marker_limits_parametrization(
    request: pytest.FixtureRequest, backend: str
) -> None:
    siblings = {
        item.callspec.params["backend"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == request.node.originalname
        and hasattr(item, "callspec")
    }
    assert backend in siblings
    assert siblings <= {"postgresql", "mysql"}


@pytest.mark.backends("mysql")
def test_mysql_driver_urls_reach_one_database(mysql_driver_urls: dict[str, str]) -> None:
    assert make_url(mysql_driver_urls["mysqldb"]).get_driver_name() == "mysqldb"
    assert make_url(mysql_driver_urls["pymysql"]).get_driver_name() == "pymysql"
    with connected(mysql_driver_urls["mysqldb"]) as engine:
        table = _create_and_fill(engine, "shared")
    with connected(mysql_driver_urls["pymysql"]) as engine, engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 2


def test_as_pymysql_keeps_everything_but_the_driver() -> None:
    url = "mysql+mysqldb://user:p%40ss@db.example:3307/dbw_x?charset=utf8mb4"
    assert as_pymysql(url) == "mysql+pymysql://user:p%40ss@db.example:3307/dbw_x?charset=utf8mb4"
    assert as_pymysql("mariadb://root@h/d") == "mariadb+pymysql://root@h/d"
    assert with_driver(as_pymysql(url), "mysqldb") == url
    with pytest.raises(ValueError, match="MySQL"):
        as_pymysql("postgresql+psycopg://postgres@h/d")


def test_hypothesis_profile_is_loaded() -> None:
    # All registered profiles disable the deadline; the library default (200 ms) would
    # mean the conftest profiles were never loaded.
    assert settings().deadline is None
