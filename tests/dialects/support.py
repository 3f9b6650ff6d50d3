"""What every conformance check needs: a fake clock, independent connections, data.

The checks drive the ``Dialect`` interface directly, the way the scheduler and the
child runtime do: each actor is its own engine and connection, set up exactly as
dbworker sets up its own (``coordinator_engine_options`` + ``configure_engine``), and
every dialect call runs inside a transaction the caller owns.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Select, create_engine, event, insert, select
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from dbworker import Coordinator
from dbworker.dialects import Claim, Clock, Dialect, ErrorInfo, Owner, WorkerTable

from .models import GROUPS, ITEMS, Base, Group, Item, ItemRow, Keyed, handler

DialectFactory = Callable[[Clock], Dialect]

#: An arbitrary, recognisable epoch (2025-06-15): far from 0 so "no lease" and
#: "lease at the epoch" can never be confused.
START = 1_750_000_000.0
LEASE = 30.0
OWNER = Owner("conformance-host", 4242)
ERROR = ErrorInfo("boom", "builtins.RuntimeError", "Traceback: boom")

#: How long an actor waits for a row lock (or SQLite's write lock) before erroring.
#: No correct dialect ever waits in these checks, so this only bounds how long a broken
#: one takes to fail (1 s is MySQL's minimum).
LOCK_TIMEOUT_SECONDS = 1.0

ITEMS_WORKER = "conf_items"
FIRST_WORKER = "conf_first"
SECOND_WORKER = "conf_second"
KEYED_WORKER = "conf_keyed"
SOURCES: dict[str, type[Base]] = {
    ITEMS_WORKER: Item,
    FIRST_WORKER: Item,
    SECOND_WORKER: Item,
    KEYED_WORKER: Keyed,
}


class FakeClock:
    """The dialects' injected clock: time moves only when a check says so."""

    def __init__(self, start: float = START) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _postgresql_lock_timeout(conn: Connection, seconds: float) -> None:
    conn.exec_driver_sql(f"SET lock_timeout = '{round(seconds * 1000)}ms'")


def _mysql_lock_timeout(conn: Connection, seconds: float) -> None:
    # Whole seconds only; 1 is the minimum.
    conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {max(1, round(seconds))}")


def _sqlite_busy_timeout(conn: Connection, seconds: float) -> None:
    conn.exec_driver_sql(f"PRAGMA busy_timeout = {round(seconds * 1000)}")


#: How to bound lock waits per SQLAlchemy dialect name. This is test setup, not part of
#: what is checked; a third-party dialect adds its own entry (without one, a broken
#: dialect hangs until pytest-timeout instead of failing fast).
LOCK_TIMEOUTS: dict[str, Callable[[Connection, float], None]] = {
    "postgresql": _postgresql_lock_timeout,
    "mysql": _mysql_lock_timeout,
    "mariadb": _mysql_lock_timeout,
    "sqlite": _sqlite_busy_timeout,
}


@dataclass(frozen=True)
class Variant:
    """An eligible query, with the same rule restated in Python to derive the expected
    claim order independently of the database."""

    name: str
    query: Callable[[], Select[Any]]
    keep: Callable[[ItemRow, dict[int, bool]], bool]
    order: Callable[[ItemRow], Any]

    def expected(self) -> list[int]:
        active = dict(GROUPS)
        return [row.id for row in sorted(ITEMS, key=self.order) if self.keep(row, active)]


VARIANTS: dict[str, Variant] = {
    # A filter and an ORDER BY that is not key order.
    "ordered": Variant(
        "ordered",
        lambda: select(Item).where(Item.enabled.is_(True)).order_by(Item.priority.desc()),
        lambda row, _active: row.enabled,
        lambda row: -row.priority,
    ),
    # A join to another application table.
    "join": Variant(
        "join",
        lambda: (
            select(Item)
            .join(Group, Item.group_id == Group.id)
            .where(Group.active.is_(True))
            .order_by(Item.id)
        ),
        lambda row, active: active[row.group_id],
        lambda row: row.id,
    ),
    # An IN semi-join with ORDER BY: the plan shape MariaDB has been seen to answer with
    # no rows for a second locking claimer.
    "semijoin": Variant(
        "semijoin",
        lambda: (
            select(Item)
            .where(
                Item.group_id.in_(select(Group.id).where(Group.active.is_(True))),
                Item.enabled.is_(True),
            )
            .order_by(Item.priority.desc())
        ),
        lambda row, active: active[row.group_id] and row.enabled,
        lambda row: -row.priority,
    ),
}


@contextmanager
def statements_run(conn: Connection) -> Iterator[list[str]]:
    """The statements ``conn``'s engine sends while the block runs, whitespace folded."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(conn.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(conn.engine, "before_cursor_execute", record)


def by_id() -> Select[Any]:
    return select(Item).order_by(Item.id)


def ids(claims: Iterable[Claim]) -> list[Any]:
    return [claim.source_id for claim in claims]


def utc(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC)


class Harness:
    """One check's world: a fake clock, the dialect under test, the application's
    tables and the workers' execution tables in a fresh database, and actors."""

    def __init__(
        self,
        make_dialect: DialectFactory,
        url: str,
        workers: Iterable[str] = (ITEMS_WORKER,),
    ) -> None:
        self.url = url
        self.clock = FakeClock()
        self.dialect = make_dialect(self.clock)
        self._stack = ExitStack()
        try:
            self.app_engine = self._engine(coordinated=False)
            # Worker tables come from the public registration path, as an application's do.
            coordinator = Coordinator(sessionmaker(bind=self.app_engine), database_url=url)
            for name in workers:
                coordinator.transactional_worker(name, SOURCES[name])(handler)
            self.workers = {name: coordinator._registration(name).table for name in workers}
            # Only the tables this check uses: DDL is most of a check's cost on InnoDB.
            sources = {Group, Item} | {SOURCES[name] for name in workers}
            tables = [Base.metadata.tables[model.__tablename__] for model in sources]
            tables += [worker.table for worker in self.workers.values()]
            Base.metadata.create_all(self.app_engine, tables=tables)
            # The maintenance actor: discovery, sweeps and reads between steps.
            self.admin = self.actor()
        except BaseException:
            self._stack.close()
            raise

    @property
    def items(self) -> WorkerTable:
        return self.workers[ITEMS_WORKER]

    @property
    def first(self) -> WorkerTable:
        return self.workers[FIRST_WORKER]

    @property
    def second(self) -> WorkerTable:
        return self.workers[SECOND_WORKER]

    @property
    def keyed(self) -> WorkerTable:
        return self.workers[KEYED_WORKER]

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    # -- connections -------------------------------------------------------------------

    def _engine(self, coordinated: bool) -> Engine:
        # The application's engine keeps a pool (reads between steps reuse connections;
        # PyMySQL's connect is slow); an actor's engine backs exactly one connection.
        options = self.dialect.coordinator_engine_options() if coordinated else {}
        if coordinated:
            options = {**options, "poolclass": NullPool}
        engine = create_engine(self.url, **options)
        if coordinated:
            self.dialect.configure_engine(engine)
        self._stack.callback(engine.dispose)
        return engine

    def _connect(self, engine: Engine, lock_timeout: float) -> Connection:
        conn = engine.connect()
        self._stack.callback(conn.close)
        set_timeout = LOCK_TIMEOUTS.get(conn.dialect.name)
        if set_timeout is not None:
            with conn.begin():
                set_timeout(conn, lock_timeout)
        return conn

    def actor(self, lock_timeout: float = LOCK_TIMEOUT_SECONDS) -> Connection:
        """A coordinator's connection: its own engine, configured as dbworker does."""
        return self._connect(self._engine(coordinated=True), lock_timeout)

    def app(self, lock_timeout: float = LOCK_TIMEOUT_SECONDS) -> Connection:
        """An application connection: the user's engine defaults, nothing from dbworker."""
        return self._connect(self.app_engine, lock_timeout)

    # -- data --------------------------------------------------------------------------

    def seed(self, items: Sequence[ItemRow] = ITEMS) -> None:
        with self.app_engine.begin() as conn:
            conn.execute(insert(Group), [{"id": g, "active": a} for g, a in GROUPS])
            if items:
                conn.execute(insert(Item), [row.as_dict() for row in items])

    def add_items(self, *item_ids: int, conn: Connection | None = None) -> None:
        """Insert plain items (group 1, enabled) in ``conn``'s open transaction, or commit."""
        rows = [ItemRow(i, 1, True, 0).as_dict() for i in item_ids]
        if conn is not None:
            conn.execute(insert(Item), rows)
            return
        with self.app_engine.begin() as own:
            own.execute(insert(Item), rows)

    def add_keyed(self, *keys: str) -> None:
        with self.app_engine.begin() as conn:
            conn.execute(insert(Keyed), [{"id": k} for k in keys])

    # -- dialect calls, each in its own committed transaction ----------------------------

    def discover(self, worker: WorkerTable) -> None:
        with self.admin.begin():
            self.dialect.discover(self.admin, worker)

    def sweep(self, worker: WorkerTable, above: Any = None) -> None:
        with self.admin.begin():
            self.dialect.sweep(self.admin, worker, above=above)

    def claim(
        self,
        conn: Connection,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
    ) -> list[Claim]:
        with conn.begin():
            return self.dialect.claim(conn, worker, eligible, limit, LEASE, OWNER)

    def claim_one(
        self, worker: WorkerTable, source_id: Any, conn: Connection | None = None
    ) -> Claim:
        """Claim exactly ``source_id`` (by restricting the eligible query to it)."""
        eligible = select(worker.source_pk).where(worker.source_pk == source_id)
        claims = self.claim(conn if conn is not None else self.admin, worker, eligible, 1)
        assert ids(claims) == [source_id], f"expected to claim {source_id!r}, got {ids(claims)}"
        return claims[0]

    @contextmanager
    def transaction(self, conn: Connection | None = None) -> Iterator[Connection]:
        conn = conn if conn is not None else self.admin
        with conn.begin():
            yield conn

    # -- reading -----------------------------------------------------------------------

    def record(self, worker: WorkerTable, source_id: Any) -> dict[str, Any] | None:
        """The raw execution row (token included), read from a fresh connection."""
        table = worker.table
        with self.app_engine.connect() as conn:
            row = (
                conn.execute(select(table).where(table.c.source_id == source_id)).mappings().first()
            )
        return None if row is None else dict(row)

    def records(self, worker: WorkerTable) -> dict[Any, dict[str, Any]]:
        table = worker.table
        with self.app_engine.connect() as conn:
            rows = conn.execute(select(table)).mappings().all()
        return {row["source_id"]: dict(row) for row in rows}

    def state(self, worker: WorkerTable, source_id: Any) -> dict[str, Any] | None:
        with self.admin.begin():
            return self.dialect.read_state(self.admin, worker, source_id)

    def claimable(self, worker: WorkerTable, eligible: Select[Any] | None = None) -> list[Any]:
        """What a claim would get right now, without keeping it (rolled back)."""
        query = eligible
        if query is None:
            query = select(worker.source_pk).order_by(worker.source_pk)
        conn = self.admin
        transaction = conn.begin()
        try:
            return ids(self.dialect.claim(conn, worker, query, 1000, LEASE, OWNER))
        finally:
            transaction.rollback()
