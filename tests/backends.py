"""Database servers and per-test databases for the dbworker test suites.

This module holds the machinery behind the ``backend`` / ``database_url`` fixtures in
``conftest.py``. It deliberately does not import pytest: benchmarks and ad-hoc scripts can
reuse it to get a scratch database the same way the tests do.

Tests import it as ``from backends import ...``: ``tests/`` is not a package, and pytest's
default ``prepend`` import mode puts this directory on ``sys.path``.

Where a server comes from, per backend, first match wins:

1. ``DBWORKER_TEST_POSTGRESQL_URL`` / ``DBWORKER_TEST_MYSQL_URL``: an admin URL to a
   server. When set, it is the only candidate; if it does not answer the backend is
   unavailable.
2. The local default (``DEFAULT_URLS``) if it answers within ``PROBE_TIMEOUT_SECONDS``.
3. A testcontainers container, if a Docker engine is reachable.

Each pytest process owns one database per server backend (``dbw_<worker>_<pid>_<random>``).
It is created on first use, emptied before every test, and dropped by ``close()``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast, get_args

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import NullPool

BackendName = Literal["sqlite", "postgresql", "mysql"]
ServerBackend = Literal["postgresql", "mysql"]

BACKENDS: Final[tuple[BackendName, ...]] = get_args(BackendName)
#: Production topologies the tests build themselves (tests/topologies): a PgBouncer in
#: front of the PostgreSQL server, a PostgreSQL primary with a streaming replica, a
#: three-node MariaDB Galera cluster. Required like backends (by name, or ``all``).
TopologyName = Literal["pgbouncer", "failover", "galera"]
TOPOLOGIES: Final[tuple[TopologyName, ...]] = get_args(TopologyName)
SERVER_BACKENDS: Final[tuple[ServerBackend, ...]] = get_args(ServerBackend)

URL_ENV_VARS: Final[Mapping[ServerBackend, str]] = {
    "postgresql": "DBWORKER_TEST_POSTGRESQL_URL",
    "mysql": "DBWORKER_TEST_MYSQL_URL",
}
DEFAULT_URLS: Final[Mapping[ServerBackend, str]] = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mysql": "mysql+mysqldb://root@127.0.0.1:3306/test",
}
REQUIRE_ENV_VAR: Final = "DBWORKER_REQUIRE_BACKENDS"

# Long enough for a loaded CI machine, short enough that a missing server costs a
# developer seconds rather than the OS TCP timeout.
PROBE_TIMEOUT_SECONDS: Final = 3

# A connection leaked by an earlier test can hold locks that make DROP block. Without a
# limit that hangs until pytest-timeout fires with a useless traceback; with it the error
# names the lock wait.
_LOCK_TIMEOUT_SECONDS: Final = 30

# SQLAlchemy dialect names accepted for each server backend ("mariadb://" is a valid
# spelling for a MariaDB server).
_DIALECTS: Final[Mapping[ServerBackend, frozenset[str]]] = {
    "postgresql": frozenset({"postgresql"}),
    "mysql": frozenset({"mysql", "mariadb"}),
}

# The connect-timeout keyword differs per DBAPI. An unknown driver gets no timeout, not
# an error: the probe then just takes longer against a dead server.
_CONNECT_TIMEOUT_ARGS: Final[Mapping[str, str]] = {
    "psycopg": "connect_timeout",
    "psycopg2": "connect_timeout",
    "pg8000": "timeout",
    "mysqldb": "connect_timeout",
    "pymysql": "connect_timeout",
    "mariadbconnector": "connect_timeout",
}


class BackendUnavailable(Exception):
    """No server could be found for a backend. ``str()`` is the reason shown to the user.

    Only this exception means "skip unless required"; any other error from
    ``DatabaseServers`` (e.g. a reachable server refusing CREATE DATABASE) is a real
    failure and must not be silently skipped.
    """


def required_backends(environ: Mapping[str, str] = os.environ) -> frozenset[BackendName]:
    """Parse ``DBWORKER_REQUIRE_BACKENDS`` (comma-separated names or ``all``).

    Raises ValueError on unknown names: a typo would otherwise silently turn a required
    backend back into a skippable one, which is exactly what the variable exists to stop.
    """
    names = _required_names(environ)
    if "all" in names:
        return frozenset(BACKENDS)
    return frozenset(cast(set[BackendName], names & set(BACKENDS)))


def required_topologies(environ: Mapping[str, str] = os.environ) -> frozenset[TopologyName]:
    """The topologies ``DBWORKER_REQUIRE_BACKENDS`` requires (``all``: every one)."""
    names = _required_names(environ)
    if "all" in names:
        return frozenset(TOPOLOGIES)
    return frozenset(cast(set[TopologyName], names & set(TOPOLOGIES)))


def _required_names(environ: Mapping[str, str]) -> set[str]:
    names = {part.strip().lower() for part in environ.get(REQUIRE_ENV_VAR, "").split(",")}
    names.discard("")
    unknown = names - {"all", *BACKENDS, *TOPOLOGIES}
    if unknown:
        raise ValueError(
            f"{REQUIRE_ENV_VAR} names unknown backend(s) {sorted(unknown)}; use a "
            f"comma-separated subset of {list(BACKENDS) + list(TOPOLOGIES)} or 'all'"
        )
    return names


def render_url(url: URL) -> str:
    """Render a URL for use as a connection string, keeping the password.

    ``str(url)`` masks the password as ``***``, which is right for messages and wrong for
    URLs handed to code that has to connect.
    """
    return url.render_as_string(hide_password=False)


def with_driver(url: str, driver: str) -> str:
    """Return ``url`` with its DBAPI driver replaced, e.g. ``with_driver(u, "pymysql")``."""
    parsed = make_url(url)
    return render_url(parsed.set(drivername=f"{parsed.get_backend_name()}+{driver}"))


def as_pymysql(url: str) -> str:
    """Return the same MySQL/MariaDB database URL, but using the PyMySQL driver.

    dbworker supports both mysqlclient and PyMySQL, whose behaviour differs in ways that
    matter (error classes, how a lost connection surfaces), so tests need both spellings
    of one database.
    """
    backend = make_url(url).get_backend_name()
    if backend not in _DIALECTS["mysql"]:
        raise ValueError(f"as_pymysql() needs a MySQL/MariaDB URL, got a {backend!r} URL")
    return with_driver(url, "pymysql")


def sqlite_url(path: Path) -> str:
    """SQLite URL for a database file at ``path``.

    Built with ``URL.create`` rather than an f-string so that unusual characters in the
    temporary directory name cannot change how the URL is parsed.
    """
    return render_url(URL.create("sqlite", database=str(path)))


def process_database_name(environ: Mapping[str, str] = os.environ) -> str:
    """Name of this pytest process's database on each server.

    The xdist worker id keeps workers of one run apart and the pid keeps concurrent runs
    apart. The random suffix covers what the pid cannot: processes in different PID
    namespaces (containers, CI jobs) that share one database server.
    """
    worker = environ.get("PYTEST_XDIST_WORKER", "main")
    # Lowercase alphanumerics only: valid unquoted on both servers and well under their
    # 63/64-character identifier limits.
    worker = "".join(ch for ch in worker.lower() if ch.isalnum()) or "main"
    return f"dbw_{worker}_{os.getpid()}_{secrets.token_hex(3)}"


def _one_line(exc: BaseException) -> str:
    """Condense a driver exception to one line, so it fits a pytest skip reason."""
    detail: BaseException = exc
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        # SQLAlchemy's wrapper appends the SQL and a docs link; the driver's own text is
        # what explains why the connection failed.
        detail = exc.orig
    text = " ".join(str(detail).split()) or type(detail).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _admin_engine(url: URL) -> Engine:
    """Engine for fixture-side administration.

    NullPool so no connection outlives the ``with`` block that used it: a pooled idle
    connection from the fixture itself would make DROP DATABASE fail or block. AUTOCOMMIT
    because CREATE/DROP DATABASE cannot run inside a transaction on PostgreSQL.
    """
    connect_args: dict[str, Any] = {}
    timeout_arg = _CONNECT_TIMEOUT_ARGS.get(url.get_driver_name())
    if timeout_arg is not None:
        connect_args[timeout_arg] = PROBE_TIMEOUT_SECONDS
    return sa.create_engine(
        url, poolclass=NullPool, isolation_level="AUTOCOMMIT", connect_args=connect_args
    )


def probe(url: URL) -> str | None:
    """Return None if the server at ``url`` answers a query, else the reason it did not."""
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as exc:
        return _one_line(exc)
    finally:
        engine.dispose()
    return None


def _docker_unreachable_reason() -> str | None:
    """Return None if a Docker engine answers, else why not."""
    try:
        import docker  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return "the 'docker' package is not installed (install the 'test' extra)"
    try:
        client = docker.from_env(timeout=PROBE_TIMEOUT_SECONDS)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return _one_line(exc)
    return None


def _start_container(backend: ServerBackend) -> tuple[URL, Any]:
    """Start a throwaway server; return its admin URL and the container to stop later."""
    container: Any
    if backend == "postgresql":
        try:
            from testcontainers.community.postgres import PostgresContainer
        except ImportError:  # testcontainers < 4.10 has no "community" namespace
            from testcontainers.postgres import PostgresContainer
        # Same major version as the local server, so results do not depend on where the
        # server came from.
        container = PostgresContainer("postgres:15", driver="psycopg")
    else:
        try:
            from testcontainers.community.mysql import MySqlContainer
        except ImportError:
            from testcontainers.mysql import MySqlContainer
        # root, because the fixture needs CREATE/DROP DATABASE, which the image's
        # ordinary user is not granted.
        container = MySqlContainer(
            "mariadb:10.11", dialect="mysqldb", username="root", password="test", dbname="test"
        )
    container.start()
    try:
        url = make_url(container.get_connection_url())
    except BaseException:
        container.stop()
        raise
    return url, container


class _Server:
    """One server backend: how to create, empty and drop this process's database."""

    def __init__(self, backend: ServerBackend, admin_url: URL, database: str) -> None:
        self.backend = backend
        self.admin_url = admin_url
        self.database = database
        self.database_url = admin_url.set(database=database)
        self._admin = _admin_engine(admin_url)
        self._created = False
        # The database is empty right after CREATE, so the first test can skip a reset.
        self._pristine = False

    def _quoted(self, conn: Connection) -> str:
        return conn.dialect.identifier_preparer.quote(self.database)

    def create(self) -> None:
        with self._admin.connect() as conn:
            name = self._quoted(conn)
            if self.backend == "postgresql":
                # template0, not template1: template1 may carry extensions or objects a
                # developer installed, and the contract is an EMPTY database.
                conn.exec_driver_sql(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'")
            else:
                conn.exec_driver_sql(self._mysql_create_sql(name))
        self._created = True
        self._pristine = True

    @staticmethod
    def _mysql_create_sql(name: str) -> str:
        # Explicit utf8mb4: MariaDB's compiled-in default is latin1, and the charset
        # must not depend on how a particular server was configured.
        return f"CREATE DATABASE {name} CHARACTER SET utf8mb4"

    def reset(self) -> None:
        """Make the database empty again, whatever the previous test left in it."""
        if self._pristine:
            self._pristine = False
            return
        if self.backend == "postgresql":
            self._reset_postgresql()
        else:
            self._reset_mysql()

    def _reset_postgresql(self) -> None:
        engine = _admin_engine(self.database_url)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f"SET lock_timeout = '{_LOCK_TIMEOUT_SECONDS}s'")
                # Sessions leaked by the previous test (an undisposed engine, a worker
                # subprocess still running) would hold locks and advisory locks into
                # this test; end them so every test starts from a quiet database.
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                # Dropping whole schemas also removes sequences, enum types, views and
                # functions, which reflect + drop_all would leave behind, and does not
                # depend on foreign-key ordering.
                schemas = conn.exec_driver_sql(
                    "SELECT nspname FROM pg_namespace"
                    " WHERE nspname !~ '^pg_' AND nspname <> 'information_schema'"
                ).scalars()
                preparer = conn.dialect.identifier_preparer
                for schema in list(schemas):
                    conn.exec_driver_sql(f"DROP SCHEMA {preparer.quote(schema)} CASCADE")
                conn.exec_driver_sql("CREATE SCHEMA public")
                # Match the privileges of a freshly created PostgreSQL 15+ database.
                conn.exec_driver_sql("GRANT USAGE ON SCHEMA public TO PUBLIC")
        finally:
            engine.dispose()

    def _reset_mysql(self) -> None:
        # DROP + CREATE DATABASE is as fast as dropping tables here (a few ms) and also
        # removes views, routines and events, with no foreign-key ordering to get right.
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {_LOCK_TIMEOUT_SECONDS}")
            self._kill_mysql_sessions(conn)
            name = self._quoted(conn)
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
            conn.exec_driver_sql(self._mysql_create_sql(name))

    def _kill_mysql_sessions(self, conn: Connection) -> None:
        # Same reason as pg_terminate_backend above: leaked sessions holding metadata
        # locks would block DROP DATABASE.
        ids = conn.execute(
            sa.text(
                "SELECT id FROM information_schema.processlist"
                " WHERE db = :db AND id <> CONNECTION_ID()"
            ),
            {"db": self.database},
        ).scalars()
        for session_id in list(ids):
            # The session may have ended on its own since the SELECT.
            with contextlib.suppress(sa.exc.DBAPIError):
                conn.exec_driver_sql(f"KILL {int(session_id)}")

    def drop(self) -> None:
        if not self._created:
            return
        with self._admin.connect() as conn:
            name = self._quoted(conn)
            if self.backend == "postgresql":
                version = conn.dialect.server_version_info or (0,)
                if version >= (13,):
                    # FORCE ends sessions the tests leaked; without it DROP DATABASE
                    # fails whenever a single connection is still open.
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                else:
                    conn.execute(
                        sa.text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE datname = :db"
                        ),
                        {"db": self.database},
                    )
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
            else:
                self._kill_mysql_sessions(conn)
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        self._created = False

    def dispose(self) -> None:
        self._admin.dispose()


@dataclass
class _Failure:
    """A cached outcome that is not a server, so later tests fail/skip without retrying."""

    error: Exception


class DatabaseServers:
    """Per-process registry of database servers and this process's databases.

    Servers are located lazily, so a run that only touches SQLite never probes a server
    or starts a container. The outcome, good or bad, is cached for the life of the
    object (one pytest session): a missing server costs one probe, not one per test.
    """

    def __init__(self, database_name: str | None = None) -> None:
        self.database_name = database_name or process_database_name()
        self._servers: dict[ServerBackend, _Server | _Failure] = {}
        self._cleanup = contextlib.ExitStack()

    def database_url(self, backend: ServerBackend) -> str:
        """URL of this process's (emptied) database on ``backend``'s server.

        Raises BackendUnavailable if no server can be found; any other exception means a
        server was found but could not be used.
        """
        state = self._servers.get(backend)
        if state is None:
            state = self._servers[backend] = self._open(backend)
        if isinstance(state, _Failure):
            raise state.error
        state.reset()
        return render_url(state.database_url)

    def admin_url(self, backend: ServerBackend) -> URL:
        """The admin URL of ``backend``'s server (located as ``database_url`` does)."""
        self.database_url(backend)
        state = self._servers[backend]
        assert isinstance(state, _Server)
        return state.admin_url

    def _open(self, backend: ServerBackend) -> _Server | _Failure:
        try:
            admin_url = self._locate(backend)
            server = _Server(backend, admin_url, self.database_name)
            # Callbacks run in reverse: drop the database, then release the engine,
            # then (registered earlier, in _locate) stop any container.
            self._cleanup.callback(server.dispose)
            self._cleanup.callback(server.drop)
            server.create()
        except BackendUnavailable as exc:
            return _Failure(exc)
        except Exception as exc:
            # Cache a short message for later tests, but let this first one see the
            # full traceback.
            self._servers[backend] = _Failure(
                RuntimeError(f"{backend} server found but unusable: {_one_line(exc)}")
            )
            raise
        return server

    def _locate(self, backend: ServerBackend) -> URL:
        env_var = URL_ENV_VARS[backend]
        configured = os.environ.get(env_var, "").strip()
        if configured:
            url = make_url(configured)
            if url.get_backend_name() not in _DIALECTS[backend]:
                raise ValueError(f"{env_var} must be a {backend} URL, got {url!s}")
            # An explicit URL is never second-guessed by falling back to another
            # server: tests would pass against something other than what was asked for.
            problem = probe(url)
            if problem is not None:
                raise BackendUnavailable(f"{env_var}={url!s} does not answer: {problem}")
            return url

        default = make_url(DEFAULT_URLS[backend])
        local_problem = probe(default)
        if local_problem is None:
            return default

        docker_problem = _docker_unreachable_reason()
        if docker_problem is not None:
            raise BackendUnavailable(
                f"no {backend} server: {env_var} is not set, {default!s} does not answer"
                f" ({local_problem}), and no Docker engine for testcontainers"
                f" ({docker_problem})"
            )
        try:
            url, container = _start_container(backend)
        except Exception as exc:
            raise BackendUnavailable(
                f"no {backend} server: {default!s} does not answer ({local_problem}) and"
                f" starting a testcontainers container failed: {_one_line(exc)}"
            ) from exc
        self._cleanup.callback(container.stop)
        return url

    def close(self) -> None:
        """Drop this process's databases and stop any containers it started."""
        self._servers.clear()
        self._cleanup.close()
