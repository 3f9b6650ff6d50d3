"""The state machine's world: its tables, its constants, and the engines of one test.

The tables are the machine's own (``sm_item`` rows that are eligible or not, the
``sm_effect`` rows handlers write, the ``dbworker_sm`` execution table), in a MetaData
of their own; every example starts from them emptied.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    CompoundSelect,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    Select,
    String,
    Table,
    UniqueConstraint,
    bindparam,
    case,
    create_engine,
    delete,
    event,
    literal_column,
    null,
    select,
    union_all,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from ...dialects import Dialect, ErrorInfo, Limits, WorkerTable
from ...schema import execution_table
from ..harness import DialectFactory, FakeClock
from ..servers import Server, server

# Whole seconds only: a database may add a bound float as a DECIMAL literal (exact,
# rounded once) where Python rounds each addition; with integral values both are exact,
# so the model and the database can be compared with ==.
START: Final = 1_000_000.0
LEASE: Final = 10.0
MAX_ID: Final = 9  # few keys, so inserts collide with discovery and come out of order
ACTORS: Final = 3
WRITERS: Final = 2
MAX_CRASHES: Final = 3
MAX_CLAIM: Final = 4
ERROR: Final = ErrorInfo("handler raised", "RuntimeError")
CRASH: Final = ErrorInfo("handler process died", "dbworker.WorkerCrashed")

#: How long a crashed connection's server session may take to go away.
SESSION_GONE_DEADLINE_SECONDS: Final = 30.0


class ModelMismatch(AssertionError):
    """The database did something the core model does not allow (or failed to do
    something it requires). Every check of this suite raises this, so a test can tell
    a caught bug from an accident in the harness."""


# -- schema ----------------------------------------------------------------------------

metadata = MetaData()
items = Table(
    "sm_item",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("eligible", Boolean, nullable=False),
)
#: What handlers write, in the same transaction as finish/unfinish. Surrogate key: the
#: same (source_id, token) may legitimately be attempted again after a rollback.
effects = Table(
    "sm_effect",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("source_id", Integer, nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),
)
executions = execution_table("sm", Integer(), metadata)
#: Periodic workers' ticks, shaped as ``dbworker_ticks``: one row per (worker, slot).
ticks = Table(
    "sm_tick",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("worker", String(32), nullable=False),
    Column("slot", BigInteger, nullable=False),
    UniqueConstraint("worker", "slot"),
)
WORKER: Final = WorkerTable("sm", executions, items.c.id, monotonic_keys=True)
#: Keys of the keyed worker's items: few, so that items share them.
KEYS: Final = 3
#: A second worker over the same rows, ``exclusive_by`` their key (``id % KEYS``): its
#: execution table has ``held_key`` under a unique index (``KeyedRules``).
keyed_executions = execution_table("smk", Integer(), metadata, keyed=True)
KEYED: Final = WorkerTable(
    "smk",
    keyed_executions,
    items.c.id,
    monotonic_keys=True,
    limits=Limits(exclusive_key=items.c.id % KEYS),
)


def key_of(sid: int) -> str:
    """The keyed worker's key of item ``sid``, as stored in ``held_key``."""
    return str(sid % KEYS)


def eligible() -> Select[Any]:
    return select(items).where(items.c.eligible.is_(True)).order_by(items.c.id)


# -- harness: engines, created once per test -------------------------------------------


@dataclass
class StatefulHarness:
    #: The SQLAlchemy dialect's name (the machine class is named after it).
    backend: str
    server: Server
    dialect: Dialect
    clock: FakeClock
    #: Actors and application writers; configured the way the coordinator configures its own.
    engine: Engine
    #: Autocommit reads of committed state, and the per-example reset.
    reader: Connection
    #: Execution rows (tagged 0, or 1 where the dialect's claim guard admits them) and
    #: effect rows (tagged 2) in one round trip; built once, since constructing SQL
    #: costs more than running it on tables this small.
    state_query: CompoundSelect[Any] = field(init=False)

    def __post_init__(self) -> None:
        t = executions
        now = bindparam("now", type_=Float())
        self.state_query = union_all(
            select(
                case((self.dialect.claimable(t, now), 1), else_=0),
                t.c.source_id,
                t.c.status,
                t.c.token,
                t.c.lease_expires_at,
                t.c.not_before,
                t.c.attempts,
                t.c.failures,
                t.c.crashes,
                t.c.error,
            ),
            select(
                literal_column("2"),
                effects.c.source_id,
                effects.c.kind,
                effects.c.token,
                *[null()] * 6,
            ),
        )

    @property
    def concurrent(self) -> bool:
        return self.dialect.supports_concurrent_claims

    def reset(self) -> None:
        # DELETE, not DDL: a fresh schema per example would cost more than the example.
        for table in (effects, executions, keyed_executions, items, ticks):
            self.reader.execute(delete(table))
        self.clock.now = START

    def session_id(self, conn: Connection) -> int | None:
        if self.server.session_id is None:
            return None
        return int(conn.exec_driver_sql(self.server.session_id).scalar_one())

    def wait_session_gone(self, session_id: int | None) -> None:
        """Wait until the server has rolled back a dropped connection's transaction, so
        the next step does not see its locks as if they were still held on purpose."""
        if session_id is None or self.server.sessions_with_id is None:
            return
        query = self.server.sessions_with_id.format(id=session_id)
        deadline = time.monotonic() + SESSION_GONE_DEADLINE_SECONDS
        while self.reader.exec_driver_sql(query).scalar_one():
            if time.monotonic() > deadline:
                raise RuntimeError(f"server session {session_id} outlived its connection")
            time.sleep(0.001)

    def is_lock_wait(self, error: DBAPIError) -> bool:
        return self.server.is_lock_wait(error)


def _fail_lock_waits_at_once(engine: Engine, server: Server) -> None:
    """In one thread a lock wait on another open transaction of the same test never ends.
    Make it a quick error that the machine can judge."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            for statement in server.machine_session:
                cursor.execute(statement)
        finally:
            cursor.close()
        if server.commit_session:
            dbapi_connection.commit()


@contextlib.contextmanager
def open_harness(url: str, make_dialect: DialectFactory) -> Iterator[StatefulHarness]:
    """Engines and tables for one test (dropped at the end); the machine empties the
    tables per example."""
    clock = FakeClock(START)
    dialect = make_dialect(clock)
    dialect.validate_url(make_url(url))
    engine = create_engine(url, **dialect.coordinator_engine_options())
    dialect.configure_engine(engine)
    found = server(engine.dialect.name)
    _fail_lock_waits_at_once(engine, found)
    reader_engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        metadata.create_all(reader_engine)
        with reader_engine.connect() as reader:
            yield StatefulHarness(engine.dialect.name, found, dialect, clock, engine, reader)
        engine.dispose()
        metadata.drop_all(reader_engine)
    finally:
        engine.dispose()
        reader_engine.dispose()
