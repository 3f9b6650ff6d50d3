"""What every conformance check needs: a fake clock, independent connections, data.

The checks drive the ``Dialect`` interface directly, the way the scheduler and the
handler processes do: each actor is its own engine and connection, set up exactly as
dbworker sets up its own (``coordinator_engine_options`` + ``configure_engine``), and
every dialect call runs inside a transaction the caller owns.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Select, create_engine, insert, select
from sqlalchemy.pool import NullPool

from ..dialects import Claim, Clock, Dialect, ErrorInfo, Owner, WorkerTable
from ..dialects.pooling import is_pooled
from .models import (
    FIRST_WORKER,
    GROUPS,
    ITEMS,
    ITEMS_WORKER,
    KEYED_WORKER,
    SECOND_WORKER,
    SOURCES,
    WORKERS,
    ConformanceBase,
    Group,
    Item,
    ItemRow,
    Keyed,
)
from .servers import SERVERS, per_transaction

#: Anything that makes the dialect under test from the kit's clock: a ``Dialect``
#: subclass, or e.g. ``functools.partial(dbworker.dialects.for_url, url)``.
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


class FakeClock:
    """The dialects' injected clock: time moves only when a check says so."""

    def __init__(self, start: float = START) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ids(claims: Iterable[Claim]) -> list[Any]:
    return [claim.source_id for claim in claims]


def utc(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC)


def drop_tables(url: str) -> None:
    """Drop whatever the checks created in the database ``url`` names (and nothing
    else), so that the next check finds it empty."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        ConformanceBase.metadata.drop_all(engine)
    finally:
        engine.dispose()


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
            self.workers = {name: WORKERS[name] for name in workers}
            # Only the tables this check uses: DDL is most of a check's cost on InnoDB.
            sources = {Group, Item} | {SOURCES[name] for name in workers}
            tables = [ConformanceBase.metadata.tables[model.__tablename__] for model in sources]
            tables += [worker.table for worker in self.workers.values()]
            limits = [w.limits for w in self.workers.values() if w.limits is not None]
            tables += list({id(x.slots): x.slots for x in limits if x.slots is not None}.values())
            ConformanceBase.metadata.create_all(self.app_engine, tables=tables)
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

    def _engine(self, coordinated: bool, lock_timeout: float | None = None) -> Engine:
        # The application's engine keeps a pool (reads between steps reuse connections;
        # PyMySQL's connect is slow); an actor's engine backs exactly one connection.
        options = self.dialect.coordinator_engine_options() if coordinated else {}
        if coordinated:
            options = {**options, "poolclass": NullPool}
        if lock_timeout is not None:  # an actor's (the application's engine comes first)
            server = SERVERS.get(self.app_engine.dialect.name)
            if server is not None and server.lock_timeout_connect_args is not None:
                connect_args = server.lock_timeout_connect_args(lock_timeout)
                options["connect_args"] = {**options.get("connect_args", {}), **connect_args}
        engine = create_engine(self.url, **options)
        if coordinated:
            self.dialect.configure_engine(engine)
        self._stack.callback(engine.dispose)
        return engine

    def _connect(self, engine: Engine, lock_timeout: float) -> Connection:
        conn = engine.connect()
        self._stack.callback(conn.close)
        # Without a known server, a broken dialect's lock wait lasts as long as the
        # database lets it (the checks pass or fail the same).
        server = SERVERS.get(conn.dialect.name)
        if server is not None and is_pooled(conn) and server.lock_timeout_local is not None:
            per_transaction(conn, server.lock_timeout_local(lock_timeout))
        elif server is not None:
            with conn.begin():
                conn.exec_driver_sql(server.lock_timeout(lock_timeout))
        return conn

    def actor(self, lock_timeout: float = LOCK_TIMEOUT_SECONDS) -> Connection:
        """A coordinator's connection: its own engine, configured as dbworker does."""
        engine = self._engine(coordinated=True, lock_timeout=lock_timeout)
        return self._connect(engine, lock_timeout)

    def scheduler(self, lock_timeout: float = LOCK_TIMEOUT_SECONDS) -> Connection:
        """A coordinator's scheduler's connection: an actor's, set up as the scheduler
        sets up the connection it keeps (``Dialect.scheduler_connection``). A claim on
        it may commit by itself: never ``claimable`` (a claim rolled back) through it."""
        conn = self.actor(lock_timeout)
        self.dialect.scheduler_connection(conn)
        return conn

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
