"""Checks for the mistakes a first deployment makes, run where they can first be seen.

Each of these used to surface late and far from its cause: a respawn loop of
handler processes, a coroutine recorded as a handler's outcome, a driver's
ImportError, an empty SQLite file in the wrong directory. Here each one becomes a
ConfigurationError that names the fix, raised while the Coordinator is built, a
worker registered or ``start()`` called.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import FrameType, ModuleType

from sqlalchemy.engine import URL, make_url

from .core.errors import ConfigurationError
from .logs import logger

log = logger()

#: The package and the dbworker extra that install each driver the extras know about.
DRIVER_PACKAGES = {
    "psycopg": ("psycopg", "postgresql"),
    "mysqldb": ("mysqlclient", "mysql"),
    "pymysql": ("PyMySQL", "pymysql"),
}

# -- the session factory, the URL and its driver -----------------------------------------


def check_sync_session_factory(session_factory: object) -> None:
    # An async_sessionmaker is callable too, and would only fail once a coroutine
    # reached code that expects a Session.
    module = type(session_factory).__module__ or ""
    if module.startswith("sqlalchemy.ext.asyncio"):
        raise ConfigurationError(
            f"session_factory is an {type(session_factory).__name__}; dbworker needs a "
            "synchronous sessionmaker (handlers run in worker processes with a plain "
            "Session): sessionmaker(create_engine(url)) over a synchronous driver"
        )


def check_driver(url: URL) -> None:
    """The URL's driver must be synchronous and installed; say which extra installs it."""
    dialect = url.get_dialect()
    if getattr(dialect, "is_async", False):
        raise ConfigurationError(
            f"database_url uses the asyncio driver {dialect.driver!r}; dbworker's processes "
            f"use synchronous SQLAlchemy: use a synchronous driver "
            f"(e.g. {_sync_example(url)})"
        )
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        package, extra = DRIVER_PACKAGES.get(dialect.driver, (None, None))
        what = f"the {dialect.driver} driver" + (f" (the {package} package)" if package else "")
        fix = f"pip install 'dbworker[{extra}]'" if extra else "install it"
        raise ConfigurationError(
            f"database_url {url.render_as_string()} needs {what}, which is not installed "
            f"({exc}): {fix}"
        ) from exc


def _sync_example(url: URL) -> str:
    backend = url.get_backend_name()
    driver = {"postgresql": "psycopg", "mysql": "mysqldb", "mariadb": "mysqldb"}.get(backend)
    return f"{backend}+{driver}://..." if driver else f"{backend}://..."


# -- SQLite paths --------------------------------------------------------------------------


def resolve_sqlite_path(url: URL) -> URL:
    """An absolute SQLite path, resolved against the current directory now.

    A relative path is otherwise resolved by each connection against whatever the
    working directory is then: a handler process started elsewhere (a Subprocess
    executor's ``cwd``), or a ``dbworker`` command run from another directory, would
    silently create an empty database there.
    """
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or not database or _is_uri(url):
        return url
    if os.path.isabs(database):
        return url
    resolved = os.path.abspath(database)
    log.info(
        "dbworker: the SQLite path %r is relative; using %s (resolved in the directory "
        "the Coordinator was built in)",
        database,
        resolved,
    )
    return url.set(database=resolved)


def _is_uri(url: URL) -> bool:
    database = url.database or ""
    return database.startswith("file:") or database == ":memory:"


def missing_sqlite_file(url: URL, given: URL) -> str | None:
    """Why ``url`` names no existing SQLite database (None if it does, or is not SQLite)."""
    if url.get_backend_name() != "sqlite" or _is_uri(url) or not url.database:
        return None
    path = Path(url.database)
    if path.exists():
        return None
    message = f"the SQLite database {path} does not exist"
    if given.database and not os.path.isabs(given.database):
        message += (
            f" (database_url names the relative path {given.database!r}, resolved against "
            f"{path.parent}, the working directory when the Coordinator was built)"
        )
    return message


# -- handlers --------------------------------------------------------------------------------


def check_async_driver(executor: object, url: URL) -> None:
    """An executor running ``async def`` handlers needs the database's asyncio driver;
    say which package (and dbworker extra) installs it."""
    if not getattr(executor, "runs_async", False):
        return
    from .invocation.async_runtime import ASYNC_DRIVERS, async_url

    driver = getattr(executor, "driver", None)
    target = async_url(url, driver)
    try:
        dialect = target.get_dialect(_is_async=True)
        dialect.import_dbapi()
        if importlib.util.find_spec("greenlet") is None:  # SQLAlchemy's asyncio runs on it
            raise ImportError("No module named 'greenlet'")
    except ImportError as exc:
        default, extra = ASYNC_DRIVERS.get(url.get_backend_name(), (None, None))
        package = driver or default or target.drivername
        fix = f"pip install 'dbworker[{extra}]'" if extra and driver is None else "install it"
        raise ConfigurationError(
            f"async def handlers on {url.get_backend_name()} need the asyncio driver "
            f"{package!r} ({target.drivername}) and greenlet, which are not installed "
            f"({exc}): {fix}"
        ) from exc
    except Exception as exc:  # no such dialect+driver in SQLAlchemy
        raise ConfigurationError(
            f"no asyncio driver {target.drivername!r} for database_url "
            f"{url.render_as_string()} ({exc}): name one SQLAlchemy knows, e.g. "
            'AsyncIO(driver="asyncmy") on MySQL'
        ) from exc
    if not getattr(dialect, "is_async", False):
        raise ConfigurationError(
            f"the driver {target.drivername!r} is not an asyncio driver: name one with "
            "AsyncIO(driver=...), or leave it to the default"
        )


# -- the main module and its guard -----------------------------------------------------------


def check_main_guard() -> None:
    """Refuse a ``start()`` that the main module would run again in every handler process.

    Handler processes started by multiprocessing (spawn, forkserver) import the
    main script again, under the name ``__mp_main__``; code outside an
    ``if __name__ == "__main__":`` block runs once more in each. A ``start()`` there
    would make every child try to start processes of its own, fail, exit, and be
    replaced, forever; its other effects (rows inserted) would repeat as well.
    """
    main = sys.modules.get("__main__")
    path = _rerun_path(main)
    if main is None or path is None:
        return
    line = _main_line(main, sys._getframe(1))
    if line is None:
        return  # start() is not being called by the main module's top-level code
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, SyntaxError, ValueError):
        return
    statement = next((s for s in tree.body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
    if statement is None or _guarded(statement):
        return
    raise ConfigurationError(
        f"start() was called from the top level of {path} (line {line}), outside an "
        '`if __name__ == "__main__":` block. Handler processes import the main module '
        "again, so each would run that code too (start another coordinator, insert rows "
        "again, ...). Put what the service does once under the guard:\n\n"
        '    if __name__ == "__main__":\n'
        "        coordinator.start()\n"
    )


def _rerun_path(main: ModuleType | None) -> str | None:
    """The file multiprocessing's children run again as ``__mp_main__``, if any.

    The same rules as ``multiprocessing.spawn``: a main module started by name is
    imported again by name, except a package's ``__main__``; one started as a file,
    by path; an interactive or ``-c`` main has no file and is not run again.
    """
    if main is None:
        return None
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return None
    path = getattr(main, "__file__", None)
    return path if isinstance(path, str) else None


def _main_line(main: ModuleType, frame: FrameType | None) -> int | None:
    """The line of the main module's top-level code this call is (indirectly) under."""
    namespace = vars(main)
    line = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is namespace:
            line = frame.f_lineno
        frame = frame.f_back
    return line


def _guarded(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.If) and any(
        isinstance(node, ast.Name) and node.id == "__name__" for node in ast.walk(statement.test)
    )


def check_coordinator_arguments(
    session_factory: object, database_url: str | URL, engine_options: object
) -> URL:
    """``Coordinator``'s first arguments checked; ``database_url`` as a URL."""
    check_sync_session_factory(session_factory)
    if not callable(session_factory):
        raise ConfigurationError("session_factory must be a SQLAlchemy sessionmaker")
    try:
        given = make_url(database_url)
    except Exception as exc:
        raise ConfigurationError(f"invalid database_url {database_url!r}: {exc}") from exc
    if engine_options is not None and not isinstance(engine_options, Mapping):
        raise ConfigurationError("engine_options must be a mapping of create_engine() options")
    return given


def check_stop_timeout(timeout: object) -> None:
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0
    ):
        raise ConfigurationError(f"timeout must be a number >= 0, got {timeout!r}")
