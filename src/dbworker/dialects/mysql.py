"""MySQL 8 / MariaDB 10.6+: lock execution rows by primary key, after an unlocked search."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Double,
    Integer,
    Select,
    Table,
    bindparam,
    case,
    func,
    literal_column,
    select,
    text,
    type_coerce,
    union_all,
)
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import BindParameter, ClauseElement
from sqlalchemy.sql.visitors import InternalTraversal

try:
    from sqlalchemy.sql.base import SyntaxExtension
except ImportError:  # SQLAlchemy 2.0: no UPDATE ... ORDER BY, so keyed claims go one by one
    SyntaxExtension = None  # type: ignore[assignment,misc]

from ..core.limits import HELD_KEY_LENGTH, KEY_DIGEST_PREFIX
from ..core.status import Phase
from .base import Dialect
from .open_first import (
    StraightJoin,
    in_direction,
    key_direction,
    pin_open_records,
    reuse,
    status_index,
)
from .terms import Claim, Claims, WorkerTable, by_position, claim_columns, keys_in

# 1205 lock wait timeout, 1213 deadlock, 1927 connection killed (MariaDB),
# 2002/2003 cannot connect, 2006 server gone away, 2013 lost connection, 4031 idle disconnect.
_TRANSIENT_CODES = frozenset({1205, 1213, 1927, 2002, 2003, 2006, 2013, 4031})
#: Isolation levels under which InnoDB reads an INSERT ... SELECT's source without locks.
_UNLOCKED_READS = frozenset({"READ COMMITTED", "READ UNCOMMITTED"})
#: Where a connection's binary logging is remembered (``PoolProxiedConnection.info``).
_STATEMENT_BINLOG = "dbworker_statement_binlog"
#: Where a connection's own isolation level is remembered (the same ``info``).
_ISOLATION = "dbworker_isolation_level"


def _isolation_level(conn: Connection) -> str:
    """``conn``'s isolation level without a round trip per call (``get_isolation_level``
    asks the server every time: a third of a woken MariaDB discovery's round trips). A
    level set through execution options is the one in force; otherwise the connection
    has its own, which SQLAlchemy restores whenever an option changed it, read once."""
    chosen = conn.get_execution_options().get("isolation_level")
    if chosen is not None:
        return str(chosen).upper().replace("_", " ")
    info = conn.connection.info
    level = info.get(_ISOLATION)
    if level is None:
        level = info[_ISOLATION] = conn.get_isolation_level()
    return str(level)


def _mysql_code(error: BaseException) -> object:
    orig = getattr(error, "orig", None)
    return orig.args[0] if orig is not None and getattr(orig, "args", None) else None


class _UpdateOrder(*((SyntaxExtension,) if SyntaxExtension else ()), ClauseElement):  # type: ignore[misc]
    """ORDER BY after an UPDATE's WHERE (MySQL's single-table UPDATE writes its rows in
    that order; SQLAlchemy has no construct for it)."""

    __visit_name__ = "dbworker_update_order"
    inherit_cache = True
    _traverse_internals = [("order", InternalTraversal.dp_clauseelement)]  # noqa: RUF012

    def __init__(self, order: ColumnElement[Any]) -> None:
        self.order = order

    def apply_to_update(self, update_stmt: Update) -> None:
        update_stmt.apply_syntax_extension_point(self.append_replacing_same_type, "post_criteria")


@compiles(_UpdateOrder)
def _compile_update_order(element: _UpdateOrder, compiler: SQLCompiler, **kw: Any) -> str:
    return f"ORDER BY {compiler.process(element.order, **kw)}"


class MySQLDialect(Dialect):
    backend_names: ClassVar[tuple[str, ...]] = ("mysql", "mariadb")
    # Except on a Galera cluster (``learn_server``): a group's COMMIT that loses
    # certification re-runs every item of the group and logs each, not yet told apart
    # from contention (issue 27's no-warning test).
    supports_group_commit: ClassVar[bool] = True
    default_port: ClassVar[int | None] = 3306
    # A failed statement is rolled back alone; the transaction goes on.
    failed_statement_keeps_transaction: ClassVar[bool] = True
    # MariaDB 10.5+ (RETURNING): a woken discovery's second watermark read goes.
    discovery_returns_keys: ClassVar[bool] = True
    #: How many unlocked-search rounds a claim makes before settling for fewer rows.
    search_rounds: ClassVar[int] = 4

    def db_now(self) -> ColumnElement[float]:
        # UTC_TIMESTAMP is independent of the session time zone, and TIMESTAMPDIFF
        # on DATETIMEs does no zone conversion (UNIX_TIMESTAMP(NOW()) would, and is
        # ambiguous in a DST fall-back hour). No CAST(... AS FLOAT): that is single
        # precision, which stores today's epoch in steps of 128 seconds (leases would
        # expire minutes late). Dividing by a DOUBLE literal yields a DOUBLE as it is.
        return type_coerce(
            func.timestampdiff(
                literal_column("MICROSECOND"),
                literal_column("'1970-01-01 00:00:00'"),
                func.utc_timestamp(6),
            )
            / literal_column("1e6"),
            Double(),
        )

    def learn_server(self, conn: Connection) -> None:
        # wsrep_on is ON only on a Galera node; MySQL has no such variable (no row).
        wsrep = conn.execute(text("SHOW VARIABLES LIKE 'wsrep_on'")).first()
        if wsrep is not None and str(wsrep[1]).upper() == "ON":
            self.group_commit = False

    def coordinator_engine_options(self) -> dict[str, Any]:
        # Claims read the latest committed rows; REPEATABLE READ's snapshot would
        # keep showing a record as claimable after another coordinator took it.
        return {**super().coordinator_engine_options(), "isolation_level": "READ COMMITTED"}

    def _discover_above_watermark(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        # The keys above the watermark go from the source table into pending records
        # in one statement: sent back as parameters, mysqlclient escaped eleven
        # literals per row, the coordinator's largest cost per item after its pipes.
        # Only where InnoDB reads the source as a consistent read (no locks on the
        # application's rows; REPEATABLE READ would take shared next-key locks) and
        # the binary log accepts it (statement-based logging refuses READ COMMITTED).
        # watermark_read_in_insert stays off: read inside the INSERT (MariaDB has
        # RETURNING), dependent pickups' p95 rose from 5.5-7.3 to 11 ms in 4 runs of 4
        # (benchmarks.latency); no lock wait showed in a two-session test. The keys
        # come back instead (discovery_returns_keys): the watermark read after it goes.
        if not self._discovers_in_one_statement(conn):
            return super()._discover_above_watermark(conn, worker)
        return self._discover_in_one_insert(conn, worker)

    def _discovers_in_one_statement(self, conn: Connection) -> bool:
        if _isolation_level(conn) not in _UNLOCKED_READS:
            return False
        info = conn.connection.info
        statement_binlog = info.get(_STATEMENT_BINLOG)
        if statement_binlog is None:
            log_bin, binlog_format = conn.execute(
                text("SELECT @@log_bin, @@session.binlog_format")
            ).one()
            statement_binlog = bool(int(log_bin)) and str(binlog_format).upper() == "STATEMENT"
            info[_STATEMENT_BINLOG] = statement_binlog
        return not statement_binlog

    def insert_ignore(self, table: Table, keys: Sequence[str] = ("source_id",)) -> Insert:
        # ON DUPLICATE KEY (not INSERT IGNORE, which would also swallow data errors),
        # setting the key to itself: valid after VALUES and after a SELECT alike.
        return mysql_insert(table).on_duplicate_key_update({keys[0]: table.c[keys[0]]})

    def candidates(
        self,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int | BindParameter[int],
        now: ColumnElement[float],
    ) -> Select[Any]:
        # ``limit`` may be a bound parameter: the claim builds its search once per
        # eligible-query shape and binds each round's window.
        table = worker.table
        query = eligible.with_only_columns(*claim_columns(table), maintain_column_froms=True)
        # MySQL and MariaDB walk the history in ORDER BY order as soon as open work
        # looks common (a backlog), even with fresh statistics. STRAIGHT_JOIN reads the
        # execution table first, and FORCE INDEX reads it through the status index,
        # that is, only its open records: there is no partial index here.
        query = pin_open_records(query, worker, StraightJoin)
        hint = f"FORCE INDEX ({status_index(table)})"
        for backend in self.backend_names:
            query = query.with_hint(table, hint, dialect_name=backend)
        direction = key_direction(eligible, worker)
        if direction is None:
            return query.where(self.claimable(table, now)).limit(limit)
        # In key order, one status at a time: the status index then yields each
        # status's records in key order and each part stops at the limit, however
        # large the backlog; the union of the parts is put in order again. Each status
        # ``claimable`` admits gets a part (within them, it decides): a part for each
        # other one was an impossible range, read in no time, whose parse and plan were
        # a fifth of the search's 0.42 ms on MariaDB.
        order = in_direction(table.c.source_id, direction)
        claimable = self.claimable(table, now)
        parts = [
            query.where(table.c.status == literal_column(f"'{phase.value}'"), claimable)
            .order_by(None)
            .order_by(order)
            .limit(limit)
            for phase in Phase
            if phase in self.claimable_phases
        ]
        union = union_all(*parts).subquery("dbworker_open")
        return select(*union.c).order_by(in_direction(union.c.source_id, direction)).limit(limit)

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        # MariaDB locks the application's rows too when a locking SELECT joins them,
        # and a locking semi-join that sorts through a temporary table has returned no
        # rows to a second claimer while unlocked work remained. So: search without
        # locks, then lock only execution rows by primary key, re-checking that each
        # is still claimable, and search further past rows another claimer holds.
        table = worker.table
        claims = Claims()
        seen: set[Any] = set()
        for _ in range(self.search_rounds):
            wanted = limit - len(claims)
            # Each round reads past the rows earlier rounds saw (they are skipped
            # here rather than excluded in SQL, so ``candidates`` stays one query).
            window = len(seen) + 2 * wanted + 8
            search, params = reuse(
                self, ("search", table), eligible, window, self._search(worker, eligible, window)
            )
            searched = self._rows_of(conn, search, search, params)
            found = [row[0] for row in searched if row[0] not in seen]
            if not found:
                break
            # Lock no more rows than are still wanted, walking ``found`` in the
            # eligible order: a row locked but not claimed stays locked until commit,
            # so over-locking would hand a concurrent claimer nothing.
            position = 0
            while position < len(found) and len(claims) < limit:
                chunk = found[position : position + limit - len(claims)]
                position += len(chunk)
                # One statement per count of keys, built once, on the driver's cursor.
                key = ("lock", table, len(chunk))
                lock = self._built_once(key, functools.partial(self._row_lock, table, len(chunk)))
                rows = self._rows_of(conn, key, lock, by_position(chunk))
                locked = {row[0]: Claim(*row) for row in rows}
                claims.extend(locked[i] for i in chunk if i in locked)
                # Found claimable, then locked by someone else or taken meanwhile.
                claims.skipped += len(chunk) - len(locked)
            if len(claims) >= limit or len(searched) < window:
                break
            seen.update(found)
        return claims

    def _search(
        self, worker: WorkerTable, eligible: Select[Any], window: int
    ) -> Callable[[], tuple[Select[Any], str]]:
        def build() -> tuple[Select[Any], str]:
            limit = bindparam("dbworker_window", window, type_=Integer())
            return self.candidates(worker, eligible, limit, self.now()), limit.key

        return build

    def _row_lock(self, table: Table, count: int | None = None) -> Select[Any]:
        """Lock the records ``ids`` (or ``count`` of them, ``keys_in``) that are still
        claimable, skipping locked ones."""
        lock = (
            select(*claim_columns(table))
            .where(keys_in(table, count), self.claimable(table, self.now()))
            .with_for_update(skip_locked=True)
        )
        # Through the primary key only: MariaDB 10.11 picked the open-records
        # index here, and a SKIP LOCKED read through a secondary index left a
        # lock on a row it skipped, granted once its holder committed, so
        # that holder's next finish waited for this claim's transaction.
        for backend in self.backend_names:
            lock = lock.with_hint(table, "FORCE INDEX (PRIMARY)", dialect_name=backend)
        return lock

    def update_in_order(self, statement: Any, order: ColumnElement[Any]) -> Any:
        # A limited claim's batch takes held_key's unique-index entries in key order.
        return None if SyntaxExtension is None else statement.ext(_UpdateOrder(order))

    def stored_key(self, key: ColumnElement[str]) -> ColumnElement[str]:
        # Strict mode refuses a value longer than VARCHAR(n) (CHAR_LENGTH counts
        # characters; LENGTH counts bytes): a key too long is stored as its SHA-256.
        digest = func.concat(KEY_DIGEST_PREFIX, func.sha2(key, 256))
        return case((func.char_length(key) > HELD_KEY_LENGTH, digest), else_=key)

    def is_contention(self, error: BaseException) -> bool:
        # 1213: an InnoDB deadlock, and on Galera a certification conflict: a write set
        # that lost to another node's at COMMIT is reported as a deadlock.
        return _mysql_code(error) == 1213

    def is_transient(self, error: BaseException) -> bool:
        orig = getattr(error, "orig", None)
        code = orig.args[0] if orig is not None and getattr(orig, "args", None) else None
        return code in _TRANSIENT_CODES or super().is_transient(error)
