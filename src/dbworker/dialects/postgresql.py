"""PostgreSQL: one statement claims (SKIP LOCKED search, UPDATE, RETURNING), planned with
the planner's statistics-dependent choices switched off for that statement only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Float,
    Select,
    String,
    Table,
    case,
    cast,
    column,
    extract,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert

from ..core.limits import HELD_KEY_LENGTH, KEY_DIGEST_PREFIX
from .autocommitting import psycopg_autocommitting
from .base import Dialect
from .open_first import (
    apply_modifiers,
    claimed,
    in_direction,
    key_direction,
    limit_key,
    order_terms,
    plain_shape,
    reuse,
    split_order,
)
from .pooling import POOLED, detect_pooler
from .terms import PENDING_COLUMNS, Claim, Owner, WorkerTable, claim_columns

# SQLSTATEs worth retrying: serialization failure, deadlock, lock not available,
# admin shutdown / crash shutdown / cannot connect now (a restarting server).
_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57P01", "57P02", "57P03"})

T = TypeVar("T")

#: The plan choices a claim must never be offered. Without statistics (a table nobody
#: analyzed: autovacuum off, or created a moment ago), or with statistics taken when no
#: work was open, PostgreSQL estimates one open record, and then a bitmap scan of every
#: open record followed by a sort costs the same as the ordered walk of the open-records
#: index that stops at the claim's limit; it has chosen the former with a backlog of
#: 20,000 (165 ms a claim instead of 0.05), and for a bare "smallest open key" lookup it
#: has chosen a scan of every open entry of the status index plus a sort. No shape of the
#: query rules those plans out (PostgreSQL has no hints), so the claim is planned with
#: them priced out: with sorts, bitmap scans and sequential scans disabled, the ordered
#: walk of the open-records index is the only plan left without a penalty. (The
#: primary key offers the same order, but costs more in every estimate: it holds every
#: record and cannot drop the open-status test the partial index implies.) The penalties
#: lift the plan's estimated cost far above jit_above_cost, and compiling the claim with
#: JIT took 200 ms: JIT is off for the claim too.
PLAN_SETTINGS: tuple[str, ...] = ("enable_seqscan", "enable_bitmapscan", "enable_sort", "jit")

# Reads the current values (the subquery is evaluated first: OFFSET 0 keeps it from
# being merged into the outer select list) and switches the choices off until the end
# of the transaction; the claim restores them as it runs, so they apply to no other
# statement. A setting is read when a statement is planned, before it executes. Alone
# (_GUARD), or as columns of the discovery just before a claim (discover_for_claim).
_GUARD_READ = (
    text(
        "SELECT {} OFFSET 0".format(
            ", ".join(f"current_setting('{name}') AS {name}" for name in PLAN_SETTINGS)
        )
    )
    .columns(*[column(name, String()) for name in PLAN_SETTINGS])
    .subquery("dbworker_plan")
)
_GUARD_OFF: list[ColumnElement[Any]] = [
    literal_column(f"set_config('{name}', 'off', true)") for name in PLAN_SETTINGS
]
# Its result's columns by position, the values read first: run on the driver's cursor.
_GUARD = select(*_GUARD_READ.c, *_GUARD_OFF)
# Restores what _GUARD read: an uncorrelated condition, which PostgreSQL evaluates once,
# as a one-time filter, when the statement starts executing (planning is over by then).
_RESTORE = text(
    "(SELECT {}) IS NOT NULL".format(
        " || ".join(f"set_config('{name}', :dbworker_{name}, true)" for name in PLAN_SETTINGS)
    )
)
_RESTORE_ALONE = text("SELECT " + _RESTORE.text)
#: Where a discovery that switched PLAN_SETTINGS off for the claim after it leaves its
#: transaction and the values it read (``PoolProxiedConnection.info``).
_PLANNED = "dbworker_planned_claim"
#: In the scheduler's connection's info: PLAN_SETTINGS are off for its whole session
#: (``scheduler_connection``); cleared with the driver connection it describes.
_SESSION_PLANNED = "dbworker_session_planned"
_SESSION_OFF = "SELECT " + ", ".join(
    f"set_config('{name}', 'off', false)" for name in PLAN_SETTINGS
)
#: ``_guard``'s parameters on such a connection: each setting restored to off.
_SESSION_GUARD = {f"dbworker_{name}": "off" for name in PLAN_SETTINGS}
# RESET of each, in one statement: the value the session began with.
_SESSION_RESET = (
    "SELECT set_config(name, reset_val, false) FROM pg_settings WHERE name IN ({})".format(
        ", ".join(f"'{name}'" for name in PLAN_SETTINGS)
    )
)


class PostgreSQLDialect(Dialect):
    backend_names: ClassVar[tuple[str, ...]] = ("postgresql",)
    default_port: ClassVar[int | None] = 5432
    # Each connection is a new backend process, whose catalog caches start empty.
    new_connection_is_cold: ClassVar[bool] = True
    # libpq's client state is plain memory a fork copies; DISCARD ALL resets the rest.
    sessions_outlive_processes: ClassVar[bool] = True
    # NOTIFY is delivered with the commit, to listeners on any host.
    supports_notify: ClassVar[bool] = True
    # A failed statement leaves the transaction "aborted" until it ends.
    failed_statement_aborts_transaction: ClassVar[bool] = True
    # FOR UPDATE ... SKIP LOCKED inside a CTE that an UPDATE ... RETURNING reads.
    supports_one_statement_claims: ClassVar[bool] = True
    # A data-modifying CTE reads the claim's RETURNING: its rate slots are stamped in it.
    supports_stamp_in_claim: ClassVar[bool] = True
    # The claim's plan guard is a few columns of discovery's statement.
    prepares_claim_in_discovery: ClassVar[bool] = True

    def db_now(self) -> ColumnElement[float]:
        # clock_timestamp(), not now(): now() is frozen at transaction start, and a
        # lease must be measured from when the statement really ran.
        return cast(extract("epoch", func.clock_timestamp()), Float())

    def configure_engine(self, engine: Engine, handlers: bool = False) -> None:
        super().configure_engine(engine, handlers)
        # Through PgBouncer's transaction pooling a server-side prepared statement
        # lands on a server connection other clients share: psycopg must not prepare.
        detect_pooler(engine)

    def autocommitting(self, conn: Connection) -> AbstractContextManager[bool]:
        # psycopg sends a BEGIN of its own before a transaction's first statement.
        return psycopg_autocommitting(conn)

    def scheduler_connection(self, conn: Connection) -> None:
        # PLAN_SETTINGS off for the session of the connection that only the scheduler
        # uses, whose every statement is dbworker's own: a claim then needs no statement
        # to switch them off (and on again), and, one statement, consistent by itself,
        # goes as a transaction of its own, as a discovery does: one round trip instead
        # of four (BEGIN, the switch, the claim, COMMIT). Not through a transaction
        # pooler, which may hand the next transaction to another server connection.
        if conn.info.get(POOLED) or conn.info.get(_SESSION_PLANNED):
            return
        self._for_session(conn, _SESSION_OFF)
        conn.info[_SESSION_PLANNED] = True

    def release_scheduler_connection(self, conn: Connection) -> None:
        # Back in the pool its session would plan others' statements without those
        # choices: they are reset first (to what the session began with), and a
        # connection that cannot be reset is closed (errors and stops only come here).
        if not conn.info.get(_SESSION_PLANNED):
            return
        try:
            self._for_session(conn, _SESSION_RESET)
        except Exception:
            conn.invalidate()
            return
        conn.info.pop(_SESSION_PLANNED, None)

    def _for_session(self, conn: Connection, sql: str) -> None:
        """Run ``sql`` (session-wide settings) on ``conn``, which holds no transaction."""
        with self.autocommitting(conn), conn.begin():
            conn.exec_driver_sql(sql)

    def _alone_if_planned(self, conn: Connection) -> AbstractContextManager[bool]:
        """A claim's or discovery's one statement as a transaction of its own, on the
        scheduler's connection (``scheduler_connection``)."""
        if conn.info.get(_SESSION_PLANNED):
            return self.autocommitting(conn)
        return contextlib.nullcontext(False)

    def reset_session(self, conn: Connection) -> None:
        # Settings, prepared statements, temporary tables, advisory locks, LISTENs:
        # what one handler left must not reach the next. Not allowed in a transaction.
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("DISCARD ALL")

    def insert_ignore(self, table: Table, keys: Sequence[str] = ("source_id",)) -> Insert:
        return pg_insert(table).on_conflict_do_nothing(index_elements=list(keys))

    def discover_for_claim(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        # The claim's plan guard rides on discovery's statement: a woken poll's
        # transaction is then discovery, claim and COMMIT, a round trip less.
        if not (
            self.prepares_claim_in_discovery
            and self.supports_discovery_watermark
            and worker.monotonic_keys
        ):
            return super().discover_for_claim(conn, worker)
        planned = bool(conn.info.get(_SESSION_PLANNED))  # for the whole session already
        return self._discover_in_one(conn, worker, plan_claim=not planned)

    def _discover_above_watermark(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        return self._discover_in_one(conn, worker, plan_claim=False)

    def _discover_in_one(
        self, conn: Connection, worker: WorkerTable, plan_claim: bool
    ) -> tuple[int, Any]:
        # The keys above the watermark go from the source table into pending records
        # in one statement: sent back as parameters, psycopg executed one INSERT per
        # row (the coordinator's largest cost per item after its pipes). A plain
        # SELECT in a CTE locks none of the application's rows. The watermark is read
        # inside it too: a woken poll's round trip less.
        statement = self._built_once(
            ("discover_in_one", worker.table, plan_claim),
            lambda: self._discovery_statement(worker, plan_claim),
        )
        with self._alone_if_planned(conn):
            (found, largest, _added, watermark, *plan), *_ = self._rows_of(
                conn, statement, statement, {}
            )
        if plan_claim:
            # Switched off from here to the claim, which restores what was read.
            old = {f"dbworker_{name}": plan[i] for i, name in enumerate(PLAN_SETTINGS)}
            conn.info[_PLANNED] = (conn.get_transaction(), old)
        return int(found), watermark if largest is None else largest

    def _discovery_statement(self, worker: WorkerTable, plan_claim: bool = False) -> Any:
        table, pk = worker.table, worker.source_pk
        newest = select(func.max(table.c.source_id)).scalar_subquery()

        def batch(condition: ColumnElement[bool]) -> Select[Any]:
            query = select(pk.label("source_id")).where(condition)
            return worker.own(query.order_by(pk).limit(self.discovery_batch))

        # Above the watermark, or from the start when there is none: "newest IS NULL"
        # names no column, so it is a one-time filter, and each branch stays an ordered
        # walk of the primary key that stops at the batch (an OR in one WHERE would
        # filter the whole key range below the watermark instead).
        found = union_all(batch(pk > newest), batch(newest.is_(None))).cte("dbworker_found")
        added = (
            self.insert_ignore(table)
            .from_select(PENDING_COLUMNS, select(*self._pending_values(found.c.source_id)))
            .returning(table.c.source_id)
            .cte("dbworker_added")
        )
        # Each CTE is read, so that SQLAlchemy renders the INSERT (PostgreSQL runs a
        # data-modifying CTE once whether or not it is read). The statement's one
        # snapshot gives every read of ``newest`` the watermark it started from.
        statement = select(
            select(func.count()).select_from(found).scalar_subquery(),
            select(func.max(found.c.source_id)).scalar_subquery(),
            select(func.count()).select_from(added).scalar_subquery(),
            newest,
        )
        if not plan_claim:
            return statement
        # _GUARD's work as columns: the settings read in a subquery evaluated first
        # (OFFSET 0), then switched off as this statement executes (it was planned
        # already), for the claim's statement, planned next.
        return statement.add_columns(*_GUARD_READ.c, *_GUARD_OFF).select_from(_GUARD_READ)

    # -- claiming ------------------------------------------------------------------------

    def candidates(
        self, worker: WorkerTable, eligible: Select[Any], limit: int, now: ColumnElement[float]
    ) -> Select[Any]:
        # PostgreSQL has no join hints, and with a backlog or stale statistics it walks
        # or merge-joins the whole history in ORDER BY order. A LATERAL subquery with
        # OFFSET 0 cannot be flattened, so the open records are read first and each is
        # looked up in the eligible query; its ORDER BY expressions come back as columns.
        # In key order the search is the open-records index read in order, stopping at
        # the limit (planned under PLAN_SETTINGS, nothing else is on offer); other orders
        # read every claimable record and sort them: only key order has a bounded search.
        terms = [split_order(term) for term in eligible._order_by_clauses]
        checked = [term for term in terms if term is not None]
        if not plain_shape(eligible) or len(checked) < len(terms):
            return super().candidates(worker, eligible, limit, now)
        table = worker.table
        direction = key_direction(eligible, worker)
        labels: list[ColumnElement[Any]] = []
        if direction is None:
            labels = [
                element.label(f"dbworker_order_{i}") for i, (element, _) in enumerate(checked)
            ]
        lookup = (
            eligible.with_only_columns(*labels or [literal_column("1")], maintain_column_froms=True)
            .where(worker.source_pk == table.c.source_id)
            .order_by(None)
            .offset(0)
            .lateral("dbworker_eligible")
        )
        if direction is not None:
            order = [in_direction(table.c.source_id, direction)]
        else:
            order = [
                apply_modifiers(lookup.c[f"dbworker_order_{i}"], modifiers)
                for i, (_, modifiers) in enumerate(checked)
            ]
        return (
            select(*claim_columns(table))
            .select_from(table)
            .join(lookup, true())
            .where(self.claimable(table, now))
            .order_by(*order)
            .limit(limit)
        )

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        # FOR UPDATE OF <execution table> SKIP LOCKED inside the ordered scan: a
        # second claimer walks past rows the first holds and takes the next ones,
        # and the application's own rows are never locked.
        query = self.candidates(worker, eligible, limit, self.now()).with_for_update(
            of=worker.table, skip_locked=True
        )
        return self._guarded(conn, lambda: [Claim(*row) for row in conn.execute(query).all()])

    def claim(
        self,
        conn: Connection,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> list[Claim]:
        if worker.limits is not None:
            return self.claim_limited(conn, worker, eligible, limit, lease_seconds, owner)
        if limit < 1:
            return []
        if not self.supports_one_statement_claims:
            # A subclass that locks its own way keeps the two-statement claim built on it.
            return super().claim(conn, worker, eligible, limit, lease_seconds, owner)
        if order_terms(eligible) is None:
            # An ORDER BY term the statement cannot carry out of its search (textual,
            # a label): lock, then update, in two statements.
            return super().claim(conn, worker, eligible, limit, lease_seconds, owner)
        statement, params = reuse(
            self,
            ("claim", worker.table, lease_seconds, owner),
            eligible,
            limit,
            lambda: self._claim_statement(worker, eligible, limit, lease_seconds, owner),
        )
        params.update(self._guard(conn))
        # On the driver's cursor (SQLAlchemy's execution around it: 0.1-0.2 ms a claim).
        with self._alone_if_planned(conn):
            return claimed(self._rows_of(conn, statement, statement, params))

    def _claim_statement(
        self,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> tuple[Any, str]:
        """One statement that locks, claims and returns up to ``limit`` records in claim
        order, and the key of its LIMIT parameter.

        The search (``candidates``, with FOR UPDATE OF the execution table SKIP LOCKED
        inside its ordered scan, so its LIMIT counts only rows this claim locked) is a
        MATERIALIZED CTE, run once; the UPDATE joins it by key and RETURNING gives what
        it stored. RETURNING has no order, so the outer SELECT sorts the claimed rows
        by the search's ORDER BY expressions, which the CTE carries as columns.
        """
        table = worker.table
        search = self.candidates(worker, eligible, limit, self.now())
        terms = order_terms(search)
        if terms is None:
            raise TypeError(
                f"{type(self).__name__}.candidates() ordered by a term a one-statement claim "
                "cannot carry; override claim() as well"
            )
        locked = (
            search.add_columns(
                *[element.label(f"dbworker_order_{i}") for i, (element, _) in enumerate(terms)]
            )
            .with_for_update(of=table, skip_locked=True)
            .cte("dbworker_locked")
            .prefix_with("MATERIALIZED")
        )
        c = table.c
        claim = (
            update(table)
            .where(c.source_id == locked.c.source_id)
            .ordered_values(*self._claim_values(table, lease_seconds, owner))
            .returning(c.source_id, c.token, c.attempts, c.failures, c.crashes)
            .cte("dbworker_claimed")
        )
        statement = (
            select(claim.c.source_id, claim.c.token, claim.c.attempts, claim.c.failures)
            .add_columns(claim.c.crashes)
            .select_from(claim.join(locked, locked.c.source_id == claim.c.source_id))
            .where(_RESTORE)
            .order_by(
                *[
                    apply_modifiers(locked.c[f"dbworker_order_{i}"], modifiers)
                    for i, (_, modifiers) in enumerate(terms)
                ]
            )
        )
        return statement, limit_key(search)

    def _guard(self, conn: Connection) -> dict[str, str]:
        """Switch PLAN_SETTINGS off for the next statement, which restores them from the
        parameters returned here (a discovery just before, in the same transaction,
        switched them off already: ``discover_for_claim``)."""
        planned = conn.info.pop(_PLANNED, None)
        if conn.info.get(_SESSION_PLANNED):  # off for the session: restored to off
            return dict(_SESSION_GUARD)
        if planned is not None and planned[0] is conn.get_transaction():
            return dict(planned[1])
        row = self._rows_of(conn, "plan_guard", _GUARD, {})[0]
        return {f"dbworker_{name}": row[i] for i, name in enumerate(PLAN_SETTINGS)}

    def _plan_search(self, search: Select[Any]) -> Select[Any]:
        # A limited claim's search is planned as every claim's is (PLAN_SETTINGS), and
        # restores them itself, as the one-statement claim does.
        return search.where(_RESTORE)

    def _plan_params(self, conn: Connection) -> dict[str, Any]:
        return self._guard(conn)

    def key_guard(self, worker: str, key: ColumnElement[str]) -> ColumnElement[bool] | None:
        # A second claim of one free key would fail on held_key's unique index (after
        # waiting for the first), and a failed statement aborts the whole transaction
        # here: a transaction-level advisory lock on the key, tried without waiting as
        # the rows are locked, makes the second skip the key instead.
        lock = func.pg_try_advisory_xact_lock(func.hashtext(literal(worker)), func.hashtext(key))
        return or_(key.is_(None), lock)

    def stored_key(self, key: ColumnElement[str]) -> ColumnElement[str]:
        # VARCHAR(n) refuses a longer value: a key too long for held_key is stored as
        # its SHA-256 (sha256() takes bytea, hence convert_to; hex makes it text).
        digest = func.encode(func.sha256(func.convert_to(key, literal("UTF8"))), literal("hex"))
        return case(
            (func.char_length(key) > HELD_KEY_LENGTH, literal(KEY_DIGEST_PREFIX) + digest),
            else_=key,
        )

    def _guarded(self, conn: Connection, run: Callable[[], T]) -> T:
        """``run()``'s statements planned under PLAN_SETTINGS, restored afterwards (after
        an error the transaction is lost, and with it the transaction-local settings)."""
        old = self._guard(conn)
        result = run()
        if not conn.info.get(_SESSION_PLANNED):
            conn.execute(_RESTORE_ALONE, old)
        return result

    def is_contention(self, error: BaseException) -> bool:
        # Serialization failure, deadlock detected.
        sqlstate = getattr(getattr(error, "orig", None), "sqlstate", None)
        return sqlstate in ("40001", "40P01")

    def is_transient(self, error: BaseException) -> bool:
        sqlstate = getattr(getattr(error, "orig", None), "sqlstate", None)
        return sqlstate in _TRANSIENT_SQLSTATES or super().is_transient(error)
