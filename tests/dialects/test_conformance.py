"""The conformance kit's checks on every built-in dialect, on MySQL under both drivers,
and on PostgreSQL through PgBouncer: one test per check, through the kit's ``run_check``."""

from __future__ import annotations

import functools

import pytest

from backends import as_pymysql
from dbworker.dialects import for_url
from dbworker.testing import DialectFactory, check_names, run_check

#: The checks this suite runs: every one the kit has (test_broken.py holds it to that).
CHECKED = check_names()

# The root conftest honours an explicit "backend" parametrization; this one adds the
# PyMySQL run of the same MySQL database.
pytestmark = pytest.mark.parametrize(
    ("backend", "driver"),
    [
        pytest.param("sqlite", None, id="sqlite"),
        pytest.param("postgresql", None, id="postgresql"),
        # The same database through PgBouncer in transaction mode (tests/topologies).
        pytest.param("postgresql", "pgbouncer", id="postgresql-pgbouncer"),
        pytest.param("mysql", None, id="mysql"),
        pytest.param("mysql", "pymysql", id="mysql-pymysql"),
    ],
    indirect=["backend"],
)


@pytest.fixture
def url(database_url: str, driver: str | None, request: pytest.FixtureRequest) -> str:
    if driver == "pgbouncer":
        return str(request.getfixturevalue("pgbouncer").route(database_url))
    return as_pymysql(database_url) if driver == "pymysql" else database_url


@pytest.fixture
def make_dialect(url: str) -> DialectFactory:
    return functools.partial(for_url, url)


@pytest.mark.parametrize("check", CHECKED)
def test_conformance(make_dialect: DialectFactory, url: str, check: str) -> None:
    run_check(check, make_dialect, url)
