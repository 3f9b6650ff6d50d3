"""The dialect boundary: everything dbworker asks of a database, in one interface.

A dialect turns the transitions of ``core.transitions`` into SQL. The shared
statements are written once here with SQLAlchemy Core; a subclass overrides only
where its database diverges (how to lock candidates, how to insert-or-ignore,
what "now" is, which errors are worth retrying), with a comment saying why.

Every method takes an open ``Connection`` inside a transaction the caller owns,
so the completion of a handler commits in the handler's own transaction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Float,
    Select,
    Table,
    and_,
    bindparam,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL
from sqlalchemy.sql.dml import Insert

from ..core.status import OPEN, ExecutionStatus, Phase
from .claim_values import claim_values
from .driver_cursor import DriverForms
from .fenced import FencedTransitions
from .liveness import ping_when_idle
from .terms import Clock, WorkerTable, status_in, status_literal

#: What discovery sets in a new pending record (the other columns take their defaults).
PENDING_COLUMNS = (
    "source_id",
    "status",
    "token",
    "attempts",
    "failures",
    "crashes",
    "discovered_at",
    "updated_at",
)
#: An execution option marking a connection whose transaction only reads.
READ_ONLY_OPTION = "dbworker_read_only"


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    source_id: Any
    token: int
    attempts: int
    failures: int
    crashes: int
    #: The record's status as locked (a claim of a WORKING record is a takeover).
    status: str | None = None


class Claims(list[Claim]):
    """What a claim took, and how many records it found claimable but could not lock.

    Another transaction held those (on MySQL, a concurrent discovery's insert of the
    same keys locks them until it commits): they are claimable again in a moment, and
    the caller should look again soon rather than at its next poll. A dialect that
    cannot tell (one statement searches and locks) reports none.
    """

    skipped: int = 0

    @classmethod
    def of(cls, claims: Iterable[Claim], skipped: int = 0) -> Claims:
        made = cls(claims)
        made.skipped = skipped
        return made


@dataclasses.dataclass(frozen=True, slots=True)
class Owner:
    host: str
    pid: int

    @classmethod
    def current(cls) -> Owner:
        import os

        return cls(socket.gethostname()[:255], os.getpid())


#: Host names that mean this machine.
_LOOPBACK = frozenset({"", "localhost", "127.0.0.1", "::1"})


def claim_columns(table: Table) -> tuple[ColumnElement[Any], ...]:
    """What a claim reads of each record: the fields of ``Claim``, in order."""
    c = table.c
    return (c.source_id, c.token, c.attempts, c.failures, c.crashes, c.status)


def epoch_to_datetime(value: float | None) -> dt.datetime | None:
    if value is None:
        return None
    return dt.datetime.fromtimestamp(float(value), tz=dt.UTC)


class Dialect(FencedTransitions):
    """Shared SQL for every database; subclasses override the divergent parts."""

    #: The SQLAlchemy backend names (``URL.get_backend_name()``) this dialect serves.
    backend_names: ClassVar[tuple[str, ...]] = ()
    #: Whether two coordinator transactions can claim at the same time.
    supports_concurrent_claims: ClassVar[bool] = True
    #: Whether a new connection's first statements pay for loading what they read
    #: into a new server session (PostgreSQL: a new backend process, empty caches).
    new_connection_is_cold: ClassVar[bool] = False
    #: Whether a connection's session can pass from one handler process to a later
    #: one (a fork inherits the socket; ``reset_session`` clears what the first left).
    sessions_outlive_processes: ClassVar[bool] = False
    #: The server's port where a URL leaves it out (None: no server).
    default_port: ClassVar[int | None] = None
    #: Whether a handler process reads the source row apart, before the handler's
    #: transaction: in one statement outside any transaction, on a connection with
    #: ``READ_ONLY_OPTION`` (the dialect's driver connections must be in autocommit).
    source_read_apart: ClassVar[bool] = False
    #: Whether the database delivers transactional notifications (NOTIFY/LISTEN), with
    #: which writers wake coordinators on other hosts (dbworker.wakeups).
    supports_notify: ClassVar[bool] = False
    #: How many candidate rows a discovery or sweep round reads at most.
    discovery_batch: ClassVar[int] = 1000

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        # SQL expressions are immutable, and building them is most of a claim's
        # Python time: the clock and each table's claim condition are built once.
        self._db_clock: ColumnElement[float] | None = None
        self._built: dict[tuple[Any, ...], Any] = {}
        #: Built-once statements compiled for a driver, per key and SQLAlchemy dialect.
        self._driver_forms = DriverForms()

    # -- configuration -------------------------------------------------------------

    def validate_url(self, url: URL) -> None:
        """Reject URLs this database cannot coordinate through (e.g. in-memory SQLite)."""

    def same_database(self, ours: URL, theirs: URL) -> bool:
        """Whether two URLs of this database plausibly name one database.

        Only clear mismatches count: spellings of one database (a driver, an omitted
        default port, "localhost" for 127.0.0.1) must not stop a coordinator from
        being built.
        """

        def host(url: URL) -> str:
            name = (url.host or "").lower()
            return "localhost" if name in _LOOPBACK else name

        def port(url: URL) -> int | None:
            return url.port or self.default_port

        return (
            host(ours) == host(theirs)
            and port(ours) == port(theirs)
            and (ours.database or "") == (theirs.database or "")
        )

    def identity(self, url: URL) -> str:
        """One spelling of the database ``url`` names, the same wherever it is spelled
        alike by ``same_database``: writers and coordinators on one host meet under it."""
        host = (url.host or "").lower()
        host = "localhost" if host in _LOOPBACK else host
        port = url.port or self.default_port
        return f"{url.get_backend_name()}://{host}:{port}/{url.database or ''}"

    def configure_engine(self, engine: Engine, handlers: bool = False) -> None:
        """Set up an engine dbworker created itself (coordinator or child process;
        ``handlers``: one whose connections only run invocations, in a handler process,
        where the coordinator bounds how long each may take).

        Overrides call this too: its pooled connections are checked after idling, so
        that a restarted server or an idle timeout costs no transaction an error.
        """
        ping_when_idle(engine)

    def reset_session(self, conn: Connection) -> None:
        """Return the session to its state just after connecting (no transaction open)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reset a session")

    def coordinator_engine_options(self) -> dict[str, Any]:
        """Options merged under the user's ``engine_options`` for the coordinator's engine
        (child processes use the user's options alone: handlers get the app's defaults)."""
        return {}

    # -- time ----------------------------------------------------------------------

    def now(self) -> ColumnElement[float]:
        """The current time as SQL: the database's clock, or the injected test clock."""
        if self.clock is not None:
            return literal(self.clock(), Float())
        if self._db_clock is None:
            self._db_clock = self.db_now()
        return self._db_clock

    def db_now(self) -> ColumnElement[float]:  # pragma: no cover - every dialect overrides
        raise NotImplementedError

    def whole_minutes(self, seconds: ColumnElement[float]) -> ColumnElement[Any]:
        """SQL for the whole minutes in a non-negative number of ``seconds``."""
        return func.floor(seconds / 60)

    def _built_once(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """``build()``'s SQL, kept under ``key`` while "now" is the database's clock (a
        test clock's is a literal that changes, so its SQL is built each time)."""
        if self.clock is not None:
            return build()
        built = self._built.get(key)
        if built is None:
            built = self._built[key] = build()
        return built

    # -- discovery -----------------------------------------------------------------

    def discover(self, conn: Connection, worker: WorkerTable) -> int:
        """Add pending records for source rows newer than any the table knows.

        The watermark is the largest known source id (an index lookup), so an idle
        poll costs the same with a million finished rows as with none. Rows whose
        inserts commit out of key order land below the watermark; ``sweep`` finds them.
        """
        if not worker.monotonic_keys:
            return self.sweep(conn, worker)
        return self._discover_above_watermark(conn, worker)[0]

    def discover_to_watermark(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        """``discover``, and the watermark after it.

        The watermark comes from what discovery itself read (the largest known key, or
        the largest key it added) rather than from a second ``max()``: a woken poll
        costs a round trip less. Another coordinator may have added larger keys
        meanwhile; a watermark that is low only makes later sweeps look further back.
        A dialect that overrides ``discover`` keeps its own, followed by that read.
        """
        if type(self).discover is not Dialect.discover or not worker.monotonic_keys:
            return self.discover(conn, worker), self.watermark(conn, worker)
        return self._discover_above_watermark(conn, worker)

    def _discover_above_watermark(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        pk = worker.source_pk
        watermark = self.watermark(conn, worker)
        query = self._above_watermark(worker, watermark is not None, pk, self.now())
        rows = conn.execute(query, {"watermark": watermark}).all()
        added = self._add_pending(conn, worker, rows)
        # In key order and above the old watermark: the last is the largest known now.
        return added, rows[-1][0] if rows else watermark

    def _above_watermark(
        self, worker: WorkerTable, above: bool, *columns: ColumnElement[Any]
    ) -> Select[Any]:
        """``columns`` of one batch of source rows in key order, above the ``watermark``
        parameter when ``above``."""
        pk = worker.source_pk
        query = select(*columns).order_by(pk).limit(self.discovery_batch)
        return query.where(pk > bindparam("watermark", type_=pk.type)) if above else query

    def _pending_values(self, source_id: ColumnElement[Any]) -> list[ColumnElement[Any]]:
        """A new pending record for ``source_id`` as SQL, column by column
        (``PENDING_COLUMNS``): for discovery in one statement."""
        now = self.now()
        return [source_id, status_literal(Phase.PENDING), *[literal_column("0")] * 4, now, now]

    def _discovery_round(
        self, conn: Connection, worker: WorkerTable, build: Callable[[bool], Any]
    ) -> tuple[Any, Any]:
        """Run a dialect's one-statement discovery, ``build(above)`` (built once per table
        and whether a watermark bounds it); its result and the watermark it started from."""
        watermark = self.watermark(conn, worker)
        above = watermark is not None
        statement = self._built_once(("discover", worker.table, above), lambda: build(above))
        return conn.execute(statement, {"watermark": watermark}), watermark

    def _discover_in_one_insert(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        """Discovery as one ``INSERT ... SELECT`` from the source table (``insert_ignore``
        leaves keys another coordinator added): the records added, and the watermark."""

        def build(above: bool) -> Any:
            rows = self._above_watermark(worker, above, *self._pending_values(worker.source_pk))
            return self.insert_ignore(worker.table).from_select(PENDING_COLUMNS, rows)

        result, watermark = self._discovery_round(conn, worker, build)
        added = int(result.rowcount)
        return added, self.watermark(conn, worker) if added else watermark

    def sweep(self, conn: Connection, worker: WorkerTable, above: Any = None) -> int:
        """Add pending records for every source row (above ``above``) that has none."""
        table, pk = worker.table, worker.source_pk
        query = select(pk, self.now()).order_by(pk).limit(self.discovery_batch)
        if above is None:
            query = query.where(~exists().where(table.c.source_id == pk))
        else:
            # The bound on source_id repeats pk > above for the planner: PostgreSQL does
            # not carry it across the join, and merge-joins the whole history otherwise.
            query = query.where(pk > above).where(
                ~exists().where(table.c.source_id == pk, table.c.source_id > above)
            )
        return self._add_pending(conn, worker, conn.execute(query).all())

    def probe(self, conn: Connection, worker: WorkerTable, above: Any) -> bool:
        """Whether a poll may find anything: a source row above ``above`` (the
        watermark), or any open record. Two index probes in one statement (the end of
        the primary key, the first open record), so an idle poll reads next to nothing."""
        table, pk = worker.table, worker.source_pk
        # max(), not EXISTS(pk > above): every planner answers max() of an indexed
        # column from the index's end, while a never-analyzed PostgreSQL table gets a
        # sequential scan for the EXISTS (and reads it all when nothing is newer).
        newest = select(func.max(pk)).scalar_subquery()
        statement = select(
            or_(
                newest > bindparam("above", type_=pk.type),
                exists().where(status_in(table.c.status, OPEN)),
            )
        )
        return bool(conn.execute(statement, {"above": above}).scalar())

    def watermark(self, conn: Connection, worker: WorkerTable) -> Any:
        return conn.execute(select(func.max(worker.table.c.source_id))).scalar()

    def _add_pending(self, conn: Connection, worker: WorkerTable, rows: Sequence[Any]) -> int:
        if not rows:
            return 0
        pending = (Phase.PENDING.value, 0, 0, 0, 0)
        values = [
            dict(zip(PENDING_COLUMNS, (source_id, *pending, float(now), float(now)), strict=True))
            for source_id, now in rows
        ]
        # One statement built once, many parameter sets: SQLAlchemy sends them as
        # multi-row INSERTs without compiling a statement for every batch.
        statement = self._built_once(
            ("insert_pending", worker.table), lambda: self.insert_ignore(worker.table)
        )
        conn.execute(statement, values)
        return len(values)

    def insert_ignore(self, table: Table) -> Insert:  # pragma: no cover - overridden
        """An INSERT that skips rows whose key exists (another coordinator found them)."""
        raise NotImplementedError

    # -- claiming ------------------------------------------------------------------

    def claimable(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        """SQL for ``core.transitions.Record.claimable``: CLAIM or TAKEOVER is legal now."""
        if now is self._db_clock:
            built: ColumnElement[bool] = self._built_once(
                ("claimable", table), lambda: self._claimable_at(table, now)
            )
            return built
        return self._claimable_at(table, now)

    def _claimable_at(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        status = table.c.status
        return and_(
            status_in(status, OPEN),
            or_(
                status == status_literal(Phase.PENDING),
                and_(
                    status == status_literal(Phase.UNFINISHED),
                    or_(table.c.not_before.is_(None), table.c.not_before <= now),
                ),
                and_(status == status_literal(Phase.WORKING), table.c.lease_expires_at < now),
            ),
        )

    def candidates(
        self, worker: WorkerTable, eligible: Select[Any], limit: int, now: ColumnElement[float]
    ) -> Select[Any]:
        """The eligible query rewritten to return claimable execution records, in its order."""
        table = worker.table
        return (
            eligible.with_only_columns(*claim_columns(table), maintain_column_froms=True)
            .where(table.c.source_id == worker.source_pk, self.claimable(table, now))
            .limit(limit)
        )

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        """Select and lock up to ``limit`` claimable records (old tokens)."""
        rows = conn.execute(self.candidates(worker, eligible, limit, self.now())).all()
        return [Claim(*row) for row in rows]

    def claim(
        self,
        conn: Connection,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> list[Claim]:
        """Claim up to ``limit`` eligible records: each gets a new token and a lease."""
        if limit < 1:
            return []
        locked = self.lock_candidates(conn, worker, eligible, limit)
        skipped = locked.skipped if isinstance(locked, Claims) else 0
        if not locked:
            return Claims.of((), skipped)
        statement = self._built_once(
            ("claim", worker.table, lease_seconds, owner),
            lambda: self._claim_update(worker.table, lease_seconds, owner),
        )
        conn.execute(statement, {"ids": [c.source_id for c in locked]})
        # The caller decides on max_crashes from the claim, so report the count as
        # the UPDATE above stored it: the locked status is the one its CASE read.
        return Claims.of(
            (
                dataclasses.replace(
                    c,
                    token=c.token + 1,
                    attempts=c.attempts + 1,
                    crashes=c.crashes + (c.status == Phase.WORKING.value),
                    status=Phase.WORKING.value,
                )
                for c in locked
            ),
            skipped,
        )

    def _claim_update(self, table: Table, lease_seconds: float, owner: Owner) -> Any:
        """The UPDATE that claims the locked records ``ids``."""
        return (
            update(table)
            .where(table.c.source_id.in_(bindparam("ids", expanding=True)))
            .ordered_values(*self._claim_values(table, lease_seconds, owner))
        )

    def _claim_values(
        self, table: Table, lease_seconds: float, owner: Owner
    ) -> list[tuple[ColumnElement[Any], Any]]:
        """What a claim sets, in order (``claim_values``, from the CLAIM and TAKEOVER
        rows): every claim UPDATE (by ids, or a dialect's one statement over its own
        search) sets exactly these."""
        return claim_values(table, self.now(), lease_seconds, (owner.host, owner.pid))

    # -- reading -------------------------------------------------------------------

    def status_condition(
        self, worker: WorkerTable, source_id: Any, statuses: Iterable[ExecutionStatus]
    ) -> ColumnElement[bool]:
        """A correlated EXISTS: does ``worker`` have one of ``statuses`` for ``source_id``?"""
        table = worker.table
        wanted = [ExecutionStatus(s).value for s in statuses]
        return exists().where(table.c.source_id == source_id, table.c.status.in_(wanted))

    def read_status(self, conn: Connection, worker: WorkerTable, source_id: Any) -> Phase | None:
        table = worker.table
        value = conn.execute(select(table.c.status).where(table.c.source_id == source_id)).scalar()
        return None if value is None else Phase(value)

    def read_state(
        self, conn: Connection, worker: WorkerTable, source_id: Any
    ) -> dict[str, Any] | None:
        table = worker.table
        row = conn.execute(select(table).where(table.c.source_id == source_id)).mappings().first()
        if row is None or row["status"] == Phase.PENDING.value:
            return None
        return {
            "execution_status": ExecutionStatus(row["status"]),
            "error": row["error"],
            "lease_expires_at": epoch_to_datetime(row["lease_expires_at"]),
            "error_type": row["error_type"],
            "traceback": row["traceback"],
            "attempts": row["attempts"],
            "failures": row["failures"],
            "crashes": row["crashes"],
            "not_before": epoch_to_datetime(row["not_before"]),
            "claimed_at": epoch_to_datetime(row["claimed_at"]),
            "finished_at": epoch_to_datetime(row["finished_at"]),
            "updated_at": epoch_to_datetime(row["updated_at"]),
            "owner": (
                None
                if row["owner_host"] is None
                else {"host": row["owner_host"], "pid": row["owner_pid"]}
            ),
        }

    def counts(self, conn: Connection, worker: WorkerTable) -> dict[Phase, int]:
        table = worker.table
        rows = conn.execute(select(table.c.status, func.count()).group_by(table.c.status)).all()
        return {Phase(status): int(n) for status, n in rows}

    def failed(
        self, conn: Connection, worker: WorkerTable, limit: int | None = None
    ) -> list[dict[str, Any]]:
        table = worker.table
        query = (
            select(
                table.c.source_id,
                table.c.error,
                table.c.error_type,
                table.c.attempts,
                table.c.crashes,
                table.c.updated_at,
            )
            .where(table.c.status == status_literal(Phase.FAILED))
            .order_by(table.c.source_id)
            .limit(limit)
        )
        return [
            {**row, "updated_at": epoch_to_datetime(row["updated_at"])}
            for row in conn.execute(query).mappings()
        ]

    # -- errors --------------------------------------------------------------------

    def is_transient(self, error: BaseException) -> bool:
        """Whether retrying the same work later can succeed (lost connection, deadlock,
        lock timeout, busy database), as opposed to a bug or a schema problem."""
        if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
            return True
        return isinstance(error, sa_exc.OperationalError | sa_exc.InterfaceError)
