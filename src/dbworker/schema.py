"""The execution table: one per worker, one row per (worker, source row).

Tables live in the source model's MetaData so that ``metadata.create_all`` and
Alembic autogenerate see them beside the application's own tables. Times are
epoch seconds on the database's clock (a DOUBLE): every dialect can compute
``now + lease`` on a number, while interval arithmetic differs per database.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

from .core.limits import HELD_KEY_LENGTH
from .core.names import table_name
from .core.schedules import from_microseconds
from .core.status import OPEN

#: Modules the table's definition loads (its indexes carry PostgreSQL and SQLite
#: options), for processes that should import them before their first task.
PRELOAD_MODULES = ("sqlalchemy.orm", "sqlalchemy.dialects.postgresql", "sqlalchemy.dialects.sqlite")

_OPEN_SQL = "status IN ({})".format(", ".join(f"'{p.value}'" for p in sorted(OPEN)))


def _columns(source_id_type: TypeEngine[Any]) -> list[Column[Any]]:
    return [
        # No foreign key to the source table: an FK check would lock the
        # application's row on every insert, and dbworker must not hold its locks.
        Column("source_id", source_id_type, primary_key=True, autoincrement=False),
        Column("status", String(16), nullable=False),
        Column("token", BigInteger, nullable=False, default=0),
        Column("lease_expires_at", Double),
        Column("not_before", Double),
        Column("attempts", Integer, nullable=False, default=0),
        Column("failures", Integer, nullable=False, default=0),
        Column("crashes", Integer, nullable=False, default=0),
        Column("error", Text),
        Column("error_type", String(255)),
        Column("traceback", Text),
        Column("owner_host", String(255)),
        Column("owner_pid", Integer),
        Column("discovered_at", Double),
        Column("claimed_at", Double),
        Column("finished_at", Double),
        Column("updated_at", Double),
    ]


#: The key an ``exclusive_by`` worker's WORKING record holds (NULL otherwise), as text.
HELD_KEY = "held_key"


def held_key_index_name(worker: str) -> str:
    return f"{table_name(worker)}_held_uq"


def add_held_key(table: Table, worker: str) -> None:
    """Give an exclusive_by worker's table its ``held_key`` column and unique index.

    Set by a claim to the source row's key and cleared by every transition out of
    WORKING (``core.transitions``): the unique index is what lets no two records hold
    one key, across all coordinators. NULLs are distinct in a unique index on every
    supported database, so records that hold nothing never conflict. Where indexes
    can be partial, only held keys are in it: a few entries (one per record at work),
    where indexing the NULLs too made each claim and each ending write two index
    entries, far apart (on SQLite a keyed item's commit wrote 60% more; MariaDB has
    no partial indexes). A table made before keeps its full index, which is as correct.
    """
    if HELD_KEY in table.c:
        return
    table.append_column(Column(HELD_KEY, String(HELD_KEY_LENGTH)))
    held = text(f"{HELD_KEY} IS NOT NULL")
    Index(
        held_key_index_name(worker),
        table.c[HELD_KEY],
        unique=True,
        postgresql_where=held,
        sqlite_where=held,
    )


def add_missing_held_key(conn: Connection, table: Table) -> None:
    """Add ``held_key`` and its unique index to an execution table that an earlier
    version (or a worker without exclusive_by) created without them."""
    if HELD_KEY not in table.c:
        return
    present = {c["name"] for c in inspect(conn).get_columns(table.name, schema=table.schema)}
    if HELD_KEY not in present:
        column = table.c[HELD_KEY]
        kind = column.type.compile(dialect=conn.dialect)
        name = conn.dialect.identifier_preparer.format_table(table)
        conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN {HELD_KEY} {kind}")
    # Even when the column is there: where DDL is not transactional, an earlier run may
    # have added the column and failed before its index.
    for index in table.indexes:
        if HELD_KEY in index.columns:
            index.create(conn, checkfirst=True)


def execution_table(
    worker: str, source_id_type: TypeEngine[Any], metadata: MetaData, *, keyed: bool = False
) -> Table:
    """Define (or return the existing) execution table of ``worker`` in ``metadata``;
    ``keyed``: with the ``held_key`` column of an ``exclusive_by`` worker."""
    name = table_name(worker)
    if name in metadata.tables:
        table = metadata.tables[name]
        if keyed:
            add_held_key(table, worker)
        return table
    table = Table(name, metadata, *_columns(source_id_type), comment=f"dbworker: {worker}")
    if keyed:
        add_held_key(table, worker)
    # Claims only look at open records; a partial index (where supported) keeps
    # the scan proportional to open work, not to history. MySQL has no partial
    # indexes and uses the leading status column instead.
    Index(
        f"{name}_status_ix",
        table.c.status,
        table.c.source_id,
        postgresql_where=text(_OPEN_SQL),
        sqlite_where=text(_OPEN_SQL),
    )
    # The open records in key order: a claim whose eligible query orders by the key
    # reads them in order and stops at its limit, however large a backlog is. Only
    # partial indexes can do that; on MySQL this one just mirrors the primary key
    # (one entry per insert, never updated: the key does not change).
    Index(
        f"{name}_open_ix",
        table.c.source_id,
        postgresql_where=text(_OPEN_SQL),
        sqlite_where=text(_OPEN_SQL),
    )
    return table


def detached_table(worker: str, source_id_type: TypeEngine[Any], *, keyed: bool = False) -> Table:
    """The same table in a private MetaData, for child processes that only write rows."""
    return execution_table(worker, source_id_type, MetaData(), keyed=keyed)


def expected_columns() -> set[str]:
    return {c.name for c in _columns(Integer())}


#: The coordinator registry: one row per running coordinator (``dbworker.registry``).
COORDINATORS_TABLE = "dbworker_coordinators"


def coordinators_table(metadata: MetaData) -> Table:
    """Define (or return the existing) coordinator registry table in ``metadata``.

    It lives beside the execution tables in the source models' MetaData, so that
    ``metadata.create_all`` and Alembic autogenerate see it too.
    """
    if COORDINATORS_TABLE in metadata.tables:
        return metadata.tables[COORDINATORS_TABLE]
    return Table(
        COORDINATORS_TABLE,
        metadata,
        # A random id per start: host and pid repeat (containers often run as pid 1).
        Column("id", String(32), primary_key=True, autoincrement=False),
        Column("host", String(255), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("version", String(64), nullable=False),
        # JSON: [{"name", "concurrency", "executor"}, ...]
        Column("workers", Text, nullable=False),
        Column("database", String(255)),
        # Epoch seconds on the database's clock, like the execution tables' times.
        Column("started_at", Double, nullable=False),
        Column("heartbeat_at", Double, nullable=False),
        # JSON: the figures that are expensive to count (backlog, history), refreshed
        # by one coordinator at a time for `dbworker status` and the dashboard.
        Column("stats", Text),
        Column("stats_at", Double),
        comment="dbworker: running coordinators",
    )


#: Rate limits' slots: N rows per (worker, key), each the time it was last used.
RATE_SLOTS_TABLE = "dbworker_rate_slots"


def rate_slots_table(metadata: MetaData) -> Table:
    """Define (or return the existing) rate-limit slots table in ``metadata`` (beside
    the execution tables, so that ``create_all`` and Alembic see it)."""
    if RATE_SLOTS_TABLE in metadata.tables:
        return metadata.tables[RATE_SLOTS_TABLE]
    return Table(
        RATE_SLOTS_TABLE,
        metadata,
        Column("worker", String(HELD_KEY_LENGTH), primary_key=True, autoincrement=False),
        # '' for a worker-wide limit; the rate_limit_by key as text otherwise.
        Column("rate_key", String(HELD_KEY_LENGTH), primary_key=True, autoincrement=False),
        Column("slot", Integer, primary_key=True, autoincrement=False),
        # Epoch seconds on the database's clock; 0 for a slot never used.
        Column("used_at", Double, nullable=False),
        comment="dbworker: rate limits' slots",
    )


def has_table(conn: Connection, table: Table) -> bool:
    """Whether ``table`` exists (in its schema) on ``conn``'s database."""
    return bool(inspect(conn).has_table(table.name, schema=table.schema))


#: Every periodic worker's ticks: one shared table (and one mapped class), because
#: handler processes load the class a task names by reference.
TICKS_TABLE = "dbworker_ticks"


class _TickBase(DeclarativeBase):
    """dbworker's own declarative base: ``Tick.metadata`` is not the application's."""


class Tick(_TickBase):
    """One slot of a periodic worker's schedule, made into a row exactly once.

    ``UNIQUE (worker, slot)`` is what makes a slot one row however many coordinators
    insert it (each inserts and ignores the duplicate). The periodic worker's handler
    receives its ``Tick``; ``id`` grows with inserts, so discovery finds new ticks
    above a watermark as it finds any integer-keyed source row.
    """

    __tablename__ = TICKS_TABLE
    __table_args__ = (
        UniqueConstraint("worker", "slot", name=f"{TICKS_TABLE}_slot_uq"),
        # A worker's ticks in key order: discovery, sweeps and the idle probe read
        # only that worker's part of the table, bounded without statistics.
        Index(f"{TICKS_TABLE}_worker_ix", "worker", "id"),
        # AUTOINCREMENT: SQLite would otherwise reuse the id of a deleted last row.
        {"comment": "dbworker: periodic workers' ticks", "sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    #: The periodic worker's name.
    worker: Mapped[str] = mapped_column(String(255), nullable=False)
    #: The slot, in microseconds since the epoch (exact in every database).
    slot: Mapped[int] = mapped_column(BigInteger, nullable=False)

    @property
    def scheduled_at(self) -> dt.datetime:
        """The slot this tick is for, a timezone-aware UTC datetime."""
        return from_microseconds(self.slot)

    def __repr__(self) -> str:
        return f"Tick(id={self.id!r}, worker={self.worker!r}, scheduled_at={self.scheduled_at})"


#: The ticks table (``Tick.__table__``, typed as the Table it is).
TICKS: Table = cast(Table, Tick.__table__)
