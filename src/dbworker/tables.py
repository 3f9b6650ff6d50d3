"""A coordinator's tables: creating them, and checking that they exist, have the shape
this version expects and are where both the session factory and ``database_url`` look.

Every check here reads the database without creating anything in it: a SQLite file
that does not exist is reported as missing, not created empty on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, Table, inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from .core.errors import ConfigurationError, DBWorkerError
from .core.names import table_name
from .dialects import Dialect
from .preflight import missing_sqlite_file
from .schema import HELD_KEY, TICKS, add_missing_held_key, coordinators_table, expected_columns
from .worker import Registration

#: Attempts at creating the tables while other processes are creating them too.
CREATE_ATTEMPTS = 5


class WorkerTables:
    """The execution tables of a coordinator's workers and its registry table."""

    def __init__(
        self,
        session_factory: Callable[[], Session],
        dialect: Dialect,
        url: URL,
        given_url: URL,
        workers: Mapping[str, Registration],
    ) -> None:
        self.session_factory = session_factory
        self.dialect = dialect
        #: What every engine connects to, and the URL as given (for messages).
        self.url = url
        self.given_url = given_url
        #: The coordinator's registrations, as they grow.
        self.workers = workers

    def registry(self) -> Table:
        """The coordinator registry, in the first worker's source MetaData."""
        first = next(iter(self.workers.values()), None)
        if first is None:
            raise ConfigurationError("register a worker first: the registry lives beside it")
        return coordinators_table(first.table.table.metadata)

    def ticks(self) -> list[Table]:
        """The ticks table, when a periodic worker is registered (else none)."""
        periodic = any(w.schedule is not None for w in self.workers.values())
        return [TICKS] if periodic else []

    def rate_slots(self) -> list[Table]:
        """The rate limits' slots table, when a worker has a rate limit (else none)."""
        limits = [w.table.limits for w in self.workers.values() if w.table.limits is not None]
        return list({id(x.slots): x.slots for x in limits if x.slots is not None}.values())

    def create(self) -> None:
        """Create the execution tables of all registered workers and the registry
        (idempotent), and check that tables which already exist have the shape this
        version expects."""
        if not self.workers:
            raise ConfigurationError("register workers before create_worker_tables()")
        tables = [*self.ticks(), *(w.table.table for w in self.workers.values())]
        tables += [*self.rate_slots(), self.registry()]
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            doing: list[tuple[Table, str | None]] = []
            try:
                self._create(tables, doing)
                break
            except DBAPIError:
                # Another process made it between this one's check and its CREATE
                # (services started together; on Galera, a CREATE made on another node
                # arriving late): this CREATE fails, and checking again finds it.
                if attempt == CREATE_ATTEMPTS or not doing or not self._exists(*doing[-1]):
                    raise
        with self.session_factory() as session:
            self.check(session)

    def _create(self, tables: list[Table], doing: list[tuple[Table, str | None]]) -> None:
        """Create what is missing, noting in ``doing`` the table (and column) at hand."""
        with self.session_factory() as session:
            bind = session.connection()
            for table in tables:
                doing.append((table, None))
                table.create(bind, checkfirst=True)
            for worker in self.workers.values():
                doing.append((worker.table.table, HELD_KEY))
                add_missing_held_key(bind, worker.table.table)
            doing.clear()
            session.commit()

    def _exists(self, table: Table, column: str | None) -> bool:
        """Whether ``table`` (and its ``column``) exists now."""
        with self.session_factory() as session:
            inspector = inspect(session.connection())
            if not inspector.has_table(table.name, table.schema):
                return False
            names = {c["name"] for c in inspector.get_columns(table.name, table.schema)}
            return column is None or column in names

    def check(self, session: Session, engine: Engine | None = None) -> None:
        """Check the worker tables through the session factory and, with ``engine``,
        through ``database_url`` too (which child processes and the scheduler use)."""
        inspector = inspect(session.connection())
        for ticks in [*self.ticks(), *self.rate_slots()]:
            if not inspector.has_table(ticks.name):
                raise ConfigurationError(
                    f"the table {ticks.name} of the periodic workers does not exist; call "
                    "coordinator.create_worker_tables() (or run your migrations) first"
                )
        for worker in self.workers.values():
            name = table_name(worker.name)
            if not inspector.has_table(name):
                raise ConfigurationError(
                    f"the table {name} of worker {worker.name!r} does not exist; call "
                    "coordinator.create_worker_tables() (or run your migrations) first"
                )
            present = {c["name"] for c in inspector.get_columns(name)}
            expected = expected_columns() | (
                {HELD_KEY} if HELD_KEY in worker.table.table.c else set()
            )
            missing = sorted(expected - present)
            if missing == [HELD_KEY]:
                raise ConfigurationError(
                    f"the table {name} of worker {worker.name!r} has no {HELD_KEY} column, "
                    "which exclusive_by needs: call coordinator.create_worker_tables() (it "
                    "adds the column and its unique index) or add them in a migration"
                )
            if missing:
                raise ConfigurationError(
                    f"the table {name} of worker {worker.name!r} has an older or different "
                    f"shape: missing columns {', '.join(missing)}"
                )
        if engine is None:
            return
        # End the session's transaction first: on SQLite an application engine that
        # begins IMMEDIATE holds the write lock, and the check below would wait on it.
        session.rollback()
        with engine.connect() as conn:
            missing_here = [
                table_name(w.name)
                for w in self.workers.values()
                if not inspect(conn).has_table(table_name(w.name))
            ]
        if missing_here:
            raise ConfigurationError(
                f"database_url ({self.url.render_as_string()}) has no table "
                f"{', '.join(missing_here)}, which the session factory's database has: "
                "they point at different databases"
            )

    def require(self, workers: Iterable[Registration]) -> None:
        """Refuse to go on unless the execution tables of ``workers`` exist, naming
        the command that creates them (for commands that only read them)."""
        self.check_database_exists()
        with self.session_factory() as session:
            existing = set(inspect(session.connection()).get_table_names())
        names = [table_name(w.name) for w in workers]
        missing = [name for name in names if name not in existing]
        if missing:
            where = self.url.render_as_string(hide_password=True)
            raise DBWorkerError(
                f"the worker table(s) {', '.join(missing)} do not exist yet in {where}: "
                "run `dbworker create-tables` (or your migrations) first"
            )

    def check_database_exists(self) -> None:
        # Connecting would create an empty SQLite file, and the error that follows
        # (no tables) would not say where it looked. Only for a session factory bound
        # to an engine, known to be database_url's database: another factory may
        # point elsewhere, which check() reports as such.
        if self.bound_engine() is None:
            return
        missing = missing_sqlite_file(self.url, self.given_url)
        if missing is not None:
            raise ConfigurationError(
                f"{missing}; create it with coordinator.create_worker_tables() "
                "(dbworker create-tables) or point database_url at the application's file"
            )

    def check_same_database(self) -> None:
        """The session factory's engine, if it has one, must be database_url's database."""
        bind = self.bound_engine()
        if bind is None:
            return
        ours, theirs = self.url, bind.url
        if theirs.get_backend_name() not in self.dialect.backend_names or not (
            self.dialect.same_database(ours, theirs)
        ):
            raise ConfigurationError(
                f"database_url ({ours.render_as_string()}) and the session factory's engine "
                f"({theirs.render_as_string()}) point at different databases"
            )

    def bound_engine(self) -> Engine | None:
        kw: Any = getattr(self.session_factory, "kw", {})
        bind = kw.get("bind") if isinstance(kw, Mapping) else None
        return bind if isinstance(bind, Engine) else None
