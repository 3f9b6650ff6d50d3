"""Shared fixtures for every dbworker test suite: backends, databases, Hypothesis profiles.

Fixtures
--------
``backend``
    The backend name, one of ``"sqlite"``, ``"postgresql"``, ``"mysql"``. Any test that
    uses it (directly or through ``database_url``) runs once per backend, with exactly
    those names as test ids. Restrict with ``@pytest.mark.backends("postgresql", ...)``.
``database_url``
    SQLAlchemy URL (str) of an empty, writable database for ``backend``. SQLite: a new
    file under ``tmp_path``. Servers: this process's database, emptied before the test.
    Skipped if no server is available, failed instead if the backend is listed in
    ``DBWORKER_REQUIRE_BACKENDS``.
``mysql_driver_urls``
    ``{"mysqldb": url, "pymysql": url}`` for the same MySQL database; needs
    ``@pytest.mark.backends("mysql")``.

See ``backends.py`` for where servers come from and the environment variables.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import cast

import pytest
from hypothesis import HealthCheck, settings

from backends import (
    BACKENDS,
    REQUIRE_ENV_VAR,
    BackendName,
    BackendUnavailable,
    DatabaseServers,
    as_pymysql,
    required_backends,
    sqlite_url,
    with_driver,
)

# The topologies' session fixtures (pgbouncer, failover, galera): tests/topologies.
pytest_plugins = ["topologies.fixtures"]

#: A "backend" parameter that runs the PostgreSQL tests through a route (``via``):
#: "postgresql-pgbouncer" is the postgresql backend, its database through PgBouncer.
ROUTE_SEPARATOR = "-"

# --- The conformance kit ------------------------------------------------------------------

# The kit's checks are assert statements in an installed package: rewritten, a failed
# one shows its values. (Registered before anything imports the kit.)
pytest.register_assert_rewrite("dbworker.testing")


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """A kit check that does not apply to the dialect under test is reported as a skip."""
    # Imported here, so that nothing imports the kit before its rewrite is registered.
    from dbworker.testing import NotApplicable

    try:
        return (yield)
    except NotApplicable as exc:
        pytest.skip(str(exc))


# --- Hypothesis profiles ------------------------------------------------------------------

# Every profile disables the deadline: examples that talk to a database server have
# latency dominated by I/O and scheduling, and a deadline would turn a slow CI machine
# into flaky failures rather than finding bugs. too_slow is suppressed for the same
# reason. function_scoped_fixture is deliberately NOT suppressed: the database is not
# reset between the examples of one test, so a @given test must isolate its examples
# itself and should say so explicitly.
_BASE_SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# print_blob lets a CI failure be replayed locally with @reproduce_failure.
settings.register_profile(
    "ci", _BASE_SETTINGS, max_examples=200, stateful_step_count=30, print_blob=True
)
settings.register_profile("dev", _BASE_SETTINGS, max_examples=25, stateful_step_count=15)
settings.register_profile(
    "nightly", _BASE_SETTINGS, max_examples=2000, stateful_step_count=50, print_blob=True
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


# --- Backend parametrization --------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    # Registered here rather than in pyproject.toml so the marker lives next to the code
    # that interprets it (addopts has --strict-markers, so it must be registered).
    config.addinivalue_line(
        "markers",
        "backends(*names): run the test only on these backends"
        f" (any of {', '.join(BACKENDS)}); filters the 'backend' parametrization",
    )
    config.addinivalue_line(
        "markers",
        "via(*routes): run the test's postgresql parametrization through these routes too"
        " (pgbouncer: the same database through a PgBouncer in transaction mode)",
    )
    config.addinivalue_line(
        "markers", "topology: builds a database topology (tests/topologies); -m topology"
    )
    # Validate up front: a typo in CI configuration should stop the run, not surface as
    # a confusing skip much later.
    try:
        required_backends()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``backend`` for every test that needs it.

    Filtering at generation time (instead of skipping inside the fixture) means excluded
    backends produce no test items at all, so they do not show up as a wall of skips.
    """
    if "backend" not in metafunc.fixturenames:
        return
    # A test that parametrizes "backend" itself has made its own choice; parametrizing
    # again would be a duplicate-parameter error.
    for mark in metafunc.definition.iter_markers("parametrize"):
        argnames = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(argnames, str):
            argnames = [name.strip() for name in argnames.split(",")]
        if "backend" in argnames:
            return

    selected: list[BackendName] = list(BACKENDS)
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is not None:
        unknown = [name for name in marker.args if name not in BACKENDS]
        if not marker.args or unknown:
            pytest.fail(
                f"{metafunc.definition.nodeid}: @pytest.mark.backends needs one or more of"
                f" {list(BACKENDS)}, got {list(marker.args)}",
                pytrace=False,
            )
        selected = [name for name in BACKENDS if name in marker.args]
    values: list[str] = list(selected)
    via = metafunc.definition.get_closest_marker("via")
    if via is not None and "postgresql" in selected:
        values += [f"postgresql{ROUTE_SEPARATOR}{route}" for route in via.args]
    metafunc.parametrize("backend", values, ids=values, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> BackendName:
    """Name of the backend under test: "sqlite", "postgresql" or "mysql"."""
    # Indirect parametrization from pytest_generate_tests puts the name in request.param.
    # It is missing only when the fixture is requested dynamically (getfixturevalue),
    # which cannot be parametrized.
    if not hasattr(request, "param"):
        pytest.fail(
            "the 'backend' fixture must be a test argument (or a dependency of one), not"
            " requested via getfixturevalue",
            pytrace=False,
        )
    return cast(BackendName, str(request.param).partition(ROUTE_SEPARATOR)[0])


def _route(request: pytest.FixtureRequest) -> str:
    """The route of the test's "backend" parameter ("" when direct)."""
    callspec = getattr(request.node, "callspec", None)
    param = callspec.params.get("backend", "") if callspec is not None else ""
    return str(param).partition(ROUTE_SEPARATOR)[2]


@pytest.fixture(scope="session")
def _database_servers() -> Iterator[DatabaseServers]:
    servers = DatabaseServers()
    yield servers
    try:
        servers.close()
    except Exception as exc:
        # Failing here would be reported against whichever test ran last; a leftover
        # database is worth a visible warning, not a wrongly-blamed test.
        warnings.warn(f"could not drop test database {servers.database_name}: {exc}", stacklevel=1)


@pytest.fixture
def database_url(
    backend: BackendName,
    tmp_path: Path,
    _database_servers: DatabaseServers,
    request: pytest.FixtureRequest,
) -> str:
    """SQLAlchemy URL string of an empty, writable database for ``backend``.

    Skips when the backend has no server, unless DBWORKER_REQUIRE_BACKENDS lists it, in
    which case the test fails. The URL includes credentials; print it with care.
    """
    if backend == "sqlite":
        return sqlite_url(tmp_path / "dbworker.sqlite")
    try:
        url = _database_servers.database_url(backend)
        route = _route(request)
        # Through a route: the same database, reached through that topology's fixture.
        return request.getfixturevalue(route).route(url) if route else url
    except BackendUnavailable as exc:
        reason = str(exc)
    # Outside the except block, so the report is just the reason, without a chained
    # "During handling of the above exception" traceback.
    if backend in required_backends():
        pytest.fail(
            f"{backend} is required ({REQUIRE_ENV_VAR}={os.environ[REQUIRE_ENV_VAR]})"
            f" but unavailable: {reason}",
            pytrace=False,
        )
    pytest.skip(f"{backend} unavailable: {reason}")


@pytest.fixture
def mysql_driver_urls(backend: BackendName, database_url: str) -> dict[str, str]:
    """The test's MySQL database under each supported driver: keys "mysqldb", "pymysql"."""
    if backend != "mysql":
        # Fail rather than skip: this is a mistake in the test, not a missing server, and
        # a skip on every other backend would hide it.
        pytest.fail(
            "mysql_driver_urls only works for the mysql backend; mark the test with"
            ' @pytest.mark.backends("mysql")',
            pytrace=False,
        )
    return {"mysqldb": with_driver(database_url, "mysqldb"), "pymysql": as_pymysql(database_url)}
