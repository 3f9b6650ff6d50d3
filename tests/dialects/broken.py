"""Deliberately broken dialects: each breaks one rule the conformance checks guard.

``test_broken.py`` runs the checks that should catch each one and expects them to
fail, which proves the checks can fail. Generic breakages are mixins, combined with the
dialect of whichever database the test runs on; the others break a particular
dialect's locking.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Connection, Select, Table, exists, func, or_, select, update

from dbworker.core.limits import Rate
from dbworker.core.status import ExecutionStatus, Phase
from dbworker.core.transitions import Transition
from dbworker.dialects import Claim, Dialect, ErrorInfo, Owner, WorkerTable
from dbworker.dialects.base import CANCELLED, claim_columns
from dbworker.dialects.mysql import MySQLDialect
from dbworker.dialects.postgresql import PostgreSQLDialect
from dbworker.dialects.sqlite import SQLiteDialect
from dbworker.dialects.terms import NEVER_ISSUED_TOKEN

# -- generic breakages (mixins) -----------------------------------------------------------


class FinishIgnoresToken(Dialect):
    """finish() completes whoever holds the record."""

    def finish(self, conn: Connection, worker: WorkerTable, source_id: Any, token: int) -> bool:
        current = self.current_token(conn, worker, source_id)
        return super().finish(conn, worker, source_id, token if current is None else current)


class FinishAllIgnoresToken(Dialect):
    """finish_all() finishes the ids of its pairs whoever holds them."""

    def finish_all(self, conn: Connection, worker: WorkerTable, held: Sequence[Any]) -> int:
        current = [(i, self.current_token(conn, worker, i) or t) for i, t in held]
        return super().finish_all(conn, worker, current)


class FinishReturningNamesAll(Dialect):
    """finish_all_returning() names every pair it was given, matched or not."""

    def finish_all_returning(
        self, conn: Connection, worker: WorkerTable, held: Sequence[tuple[Any, int]]
    ) -> set[Any]:
        super().finish_all_returning(conn, worker, held)
        return {source_id for source_id, _ in held}


class RenewIgnoresToken(Dialect):
    """renew() extends any WORKING lease, so a lost holder never finds out."""

    def renew(
        self,
        conn: Connection,
        worker: WorkerTable,
        held: Sequence[tuple[Any, int]],
        lease_seconds: float,
    ) -> list[Any]:
        current = [(i, self.current_token(conn, worker, i) or t) for i, t in held]
        return super().renew(conn, worker, current, lease_seconds)


class Unfenced(Dialect):
    """Every fenced transition ignores the token."""

    def _fenced(
        self,
        conn: Connection,
        worker: WorkerTable,
        event: Any,
        source_id: Any,
        token: int,
        values: Any,
    ) -> bool:
        current = self.current_token(conn, worker, source_id)
        token = token if current is None else current
        return super()._fenced(conn, worker, event, source_id, token, values)


class IgnoresLease(Dialect):
    """A WORKING record is claimable whether or not its lease has expired."""

    def claimable(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        return or_(super().claimable(table, now), table.c.status == Phase.WORKING.value)


class ClaimsTerminal(Dialect):
    """FINISHED and FAILED records are claimable again."""

    claimable_phases = frozenset(Phase)

    def claimable(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        terminal = table.c.status.in_([Phase.FINISHED.value, Phase.FAILED.value])
        return or_(super().claimable(table, now), terminal)


class IgnoresNotBefore(Dialect):
    """UNFINISHED records are claimable before their delay has passed."""

    def claimable(self, table: Table, now: ColumnElement[float]) -> ColumnElement[bool]:
        return or_(super().claimable(table, now), table.c.status == Phase.UNFINISHED.value)


class ForgetsTakeoverCrash(Dialect):
    """A takeover is not counted as a crash of the vanished holder."""

    def claim(
        self,
        conn: Connection,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> list[Claim]:
        table = worker.table
        before = dict(conn.execute(select(table.c.source_id, table.c.crashes)).all())
        claims = super().claim(conn, worker, eligible, limit, lease_seconds, owner)
        for claim in claims:
            conn.execute(
                update(table)
                .where(table.c.source_id == claim.source_id)
                .values(crashes=before[claim.source_id])
            )
        return [dataclasses.replace(c, crashes=before[c.source_id]) for c in claims]


class FinishOutsideTransaction(Dialect):
    """finish() commits on its own connection instead of in the caller's transaction."""

    def finish(self, conn: Connection, worker: WorkerTable, source_id: Any, token: int) -> bool:
        with conn.engine.begin() as own:
            return super().finish(own, worker, source_id, token)


class ResetsAnything(Dialect):
    """reset_failed() reopens any record, not only FAILED ones."""

    def reset_failed(self, conn: Connection, worker: WorkerTable, source_id: Any) -> bool:
        table = worker.table
        statement = (
            update(table)
            .where(table.c.source_id == source_id)
            .values(status=Phase.UNFINISHED.value, error=None, lease_expires_at=None)
        )
        return conn.execute(statement).rowcount == 1


class CancelLeavesUndiscovered(Dialect):
    """cancel() writes the CANCEL row only where a record exists: an item not yet
    discovered is left without one, and discovery later makes it pending."""

    def cancel(self, conn: Connection, worker: WorkerTable, source_id: Any) -> bool:
        return self.transition(
            conn, worker, Transition.CANCEL, source_id, NEVER_ISSUED_TOKEN, error=CANCELLED
        )


class CancelIgnoresStatus(Dialect):
    """cancel() fails any record, finished ones and a finish that just won included."""

    def cancel(self, conn: Connection, worker: WorkerTable, source_id: Any) -> bool:
        table = worker.table
        statement = (
            update(table)
            .where(table.c.source_id == source_id)
            .values(
                status=Phase.FAILED.value,
                error=CANCELLED.message,
                error_type=CANCELLED.type,
                lease_expires_at=None,
                not_before=None,
                finished_at=self.now(),
            )
        )
        return conn.execute(statement).rowcount == 1


class RetryUncounted(Dialect):
    """fail() with a retry delay does not count the failure."""

    def fail(
        self,
        conn: Connection,
        worker: WorkerTable,
        source_id: Any,
        token: int,
        error: ErrorInfo,
        retry_delay: float | None = None,
    ) -> bool:
        failures = self._failures(conn, worker, source_id)
        done = super().fail(conn, worker, source_id, token, error, retry_delay)
        table = worker.table
        conn.execute(update(table).where(table.c.source_id == source_id).values(failures=failures))
        return done

    @staticmethod
    def _failures(conn: Connection, worker: WorkerTable, source_id: Any) -> int:
        table = worker.table
        query = select(table.c.failures).where(table.c.source_id == source_id)
        return int(conn.execute(query).scalar_one())


class ReleaseAlwaysCrashes(Dialect):
    """release(counts_crash=False) is counted as a crash anyway."""

    def release(
        self,
        conn: Connection,
        worker: WorkerTable,
        source_id: Any,
        token: int,
        error: ErrorInfo,
        *,
        gives_up: bool,
        counts_crash: bool = True,
    ) -> bool:
        return super().release(
            conn, worker, source_id, token, error, gives_up=gives_up, counts_crash=True
        )


class StatusConditionIgnoresStatus(Dialect):
    """status_condition() matches any record, whatever its status."""

    def status_condition(
        self, worker: WorkerTable, source_id: Any, statuses: Iterable[ExecutionStatus]
    ) -> ColumnElement[bool]:
        return exists().where(worker.table.c.source_id == source_id)


class ClaimsInKeyOrder(Dialect):
    """Claims follow the primary key instead of the eligible query's ORDER BY."""

    def candidates(
        self, worker: WorkerTable, eligible: Select[Any], limit: int, now: ColumnElement[float]
    ) -> Select[Any]:
        query = super().candidates(worker, eligible, limit, now)
        return query.order_by(None).order_by(worker.table.c.source_id)


class DiscoversOnce(Dialect):
    """discover() only fills an empty table: rows inserted later are never found."""

    def discover(self, conn: Connection, worker: WorkerTable) -> int:
        if conn.execute(select(func.count()).select_from(worker.table)).scalar():
            return 0
        return super().discover(conn, worker)


class WatermarkBeforeDiscovery(Dialect):
    """discover_to_watermark() reports the watermark as it was before discovery."""

    def discover_to_watermark(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        before = self.watermark(conn, worker)
        added, _ = super().discover_to_watermark(conn, worker)
        return added, before


class SweepIsDiscover(Dialect):
    """sweep() only looks above the watermark, like discover()."""

    def sweep(self, conn: Connection, worker: WorkerTable, above: Any = None) -> int:
        return self.discover(conn, worker)


class WatermarkOnAnyKey(Dialect):
    """discover() uses a watermark even for keys that do not grow with inserts."""

    def discover(self, conn: Connection, worker: WorkerTable) -> int:
        return super().discover(conn, dataclasses.replace(worker, monotonic_keys=True))


class ReadStateShowsToken(Dialect):
    """read_state() exposes the fencing token."""

    def read_state(
        self, conn: Connection, worker: WorkerTable, source_id: Any
    ) -> dict[str, Any] | None:
        state = super().read_state(conn, worker, source_id)
        if state is not None:
            state["token"] = self.current_token(conn, worker, source_id)
        return state


class ReadStateShowsPending(Dialect):
    """read_state() reports discovered, never claimed records as UNFINISHED."""

    def read_state(
        self, conn: Connection, worker: WorkerTable, source_id: Any
    ) -> dict[str, Any] | None:
        state = super().read_state(conn, worker, source_id)
        if state is None and self.read_status(conn, worker, source_id) is Phase.PENDING:
            return {
                "execution_status": ExecutionStatus.UNFINISHED,
                "error": None,
                "lease_expires_at": None,
            }
        return state


class IgnoresKey(Dialect):
    """An exclusive_by worker's claim ignores the key: neither the search nor the
    claim's UPDATE (no held_key, so the unique index cannot object)."""

    def claim_limited(
        self,
        conn: Connection,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> list[Claim]:
        assert worker.limits is not None
        limits = dataclasses.replace(worker.limits, exclusive_key=None)
        unkeyed = dataclasses.replace(worker, limits=limits)
        return super().claim_limited(conn, unkeyed, eligible, limit, lease_seconds, owner)

    def _claim_values(
        self, table: Table, lease_seconds: float, owner: Owner
    ) -> list[tuple[ColumnElement[Any], Any]]:
        values = super()._claim_values(table, lease_seconds, owner)
        return [(column, value) for column, value in values if column.key != "held_key"]


class EndingKeepsKey(Dialect):
    """The transitions out of WORKING leave held_key set: a finished item's key stays
    busy for ever."""

    def _row_values(
        self, transition: Transition, delay: float | None, error: ErrorInfo | None
    ) -> dict[str, Any]:
        values = super()._row_values(transition, delay, error)
        return {name: value for name, value in values.items() if name != "held_key"}


class RateWithoutWindow(Dialect):
    """A rate limit's slots are free again at once (the window is ignored)."""

    def claim_limited(
        self,
        conn: Connection,
        worker: WorkerTable,
        eligible: Select[Any],
        limit: int,
        lease_seconds: float,
        owner: Owner,
    ) -> list[Claim]:
        assert worker.limits is not None
        rate = worker.limits.rate
        if rate is not None:
            limits = dataclasses.replace(worker.limits, rate=Rate(rate.count, 0.0))
            worker = dataclasses.replace(worker, limits=limits)
        return super().claim_limited(conn, worker, eligible, limit, lease_seconds, owner)


# -- PostgreSQL locking --------------------------------------------------------------------


class UnlockedPostgreSQL(PostgreSQLDialect):
    """Claims read candidates without locking them."""

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        return Dialect.lock_candidates(self, conn, worker, eligible, limit)


class AutocommitLeftOnPostgreSQL(PostgreSQLDialect):
    """The driver connection is left in autocommit after statements sent alone."""

    @contextlib.contextmanager
    def autocommitting(self, conn: Connection) -> Iterator[bool]:
        with super().autocommitting(conn) as alone:
            yield alone
        driver: Any = conn.connection.dbapi_connection
        if alone:
            driver.autocommit = True


class WaitingPostgreSQL(PostgreSQLDialect):
    """FOR UPDATE without SKIP LOCKED: a second claimer queues behind the first."""

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        query = self.candidates(worker, eligible, limit, self.now())
        rows = conn.execute(query.with_for_update(of=worker.table)).all()
        return [Claim(*row) for row in rows]


class SourceLockingPostgreSQL(PostgreSQLDialect):
    """FOR UPDATE SKIP LOCKED without OF: the application's rows are locked too."""

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        query = self.candidates(worker, eligible, limit, self.now())
        rows = conn.execute(query.with_for_update(skip_locked=True)).all()
        return [Claim(*row) for row in rows]


class SourceLockingDiscoveryPostgreSQL(PostgreSQLDialect):
    """Discovery reads the new keys FOR SHARE: the application's rows wait for it."""

    def _discover_above_watermark(self, conn: Connection, worker: WorkerTable) -> tuple[int, Any]:
        pk = worker.source_pk
        rows = conn.execute(select(pk, self.now()).order_by(pk).with_for_update(read=True)).all()
        return self._add_pending(conn, worker, rows), rows[-1][0] if rows else None


# -- MySQL / MariaDB locking ---------------------------------------------------------------


class RepeatableReadDiscoveryMySQL(MySQLDialect):
    """Discovers in one INSERT ... SELECT whatever the isolation level: under REPEATABLE
    READ (the connection's here) InnoDB takes shared next-key locks on the source."""

    def coordinator_engine_options(self) -> dict[str, Any]:
        return {**super().coordinator_engine_options(), "isolation_level": "REPEATABLE READ"}

    def _discovers_in_one_statement(self, conn: Connection) -> bool:
        return True


class UnlockedMySQL(MySQLDialect):
    """Claims read candidates without locking them."""

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        return Dialect.lock_candidates(self, conn, worker, eligible, limit)


class LockingSearchMySQL(MySQLDialect):
    """One locking SELECT over the eligible query, joins and all."""

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        query = self.candidates(worker, eligible, limit, self.now())
        rows = conn.execute(query.with_for_update(skip_locked=True)).all()
        return [Claim(*row) for row in rows]


class OverLockingMySQL(MySQLDialect):
    """Locks the whole search window and claims only the first ``limit`` rows, so rows
    it will not claim stay locked until commit (what the MySQL dialect once did)."""

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        table = worker.table
        found = [
            row[0]
            for row in conn.execute(self.candidates(worker, eligible, 2 * limit + 8, self.now()))
        ]
        if not found:
            return []
        query = (
            select(*claim_columns(table))
            .where(table.c.source_id.in_(found), self.claimable(table, self.now()))
            .with_for_update(skip_locked=True)
        )
        locked = {row[0]: Claim(*row) for row in conn.execute(query)}
        return [locked[i] for i in found if i in locked][:limit]


class SilentSkipsMySQL(MySQLDialect):
    """Claims pass over records another transaction holds without saying so."""

    def lock_candidates(
        self, conn: Connection, worker: WorkerTable, eligible: Select[Any], limit: int
    ) -> list[Claim]:
        return list(super().lock_candidates(conn, worker, eligible, limit))


# -- SQLite --------------------------------------------------------------------------------


class ConcurrentSQLite(SQLiteDialect):
    """Claims to support concurrent claims on a single-writer database."""

    supports_concurrent_claims: ClassVar[bool] = True


# -- the catalogue ---------------------------------------------------------------------------


def mixin(breakage: type) -> Callable[[type[Dialect]], type[Dialect]]:
    """Combine a generic breakage (a mixin, abstract on its own) with the dialect of the
    database under test."""

    def build(base: type[Dialect]) -> type[Dialect]:
        return type(f"{breakage.__name__}{base.__name__}", (breakage, base), {})

    return build


def fixed(broken: type[Dialect]) -> Callable[[type[Dialect]], type[Dialect]]:
    """A breakage of one particular dialect, whatever the base."""
    return lambda _base: broken


SERVERS = ("postgresql", "mysql")
EVERYWHERE = ("sqlite", *SERVERS)


@dataclass(frozen=True)
class Breakage:
    name: str
    build: Callable[[type[Dialect]], type[Dialect]]
    #: The backends it applies to (locking breakages are specific to one database).
    backends: tuple[str, ...]
    #: Names of the checks (keys of ``checks.CHECKS``) that must catch it.
    caught_by: tuple[str, ...]


RACING = tuple(
    f"{check}[{v}]"
    for check in ("racing_claims", "racing_claims_on_scheduler_connections")
    for v in ("ordered", "join", "semijoin")
)
SOURCE_ROWS = tuple(
    f"claim_leaves_source_rows_unlocked[{v}]" for v in ("ordered", "join", "semijoin")
)

BREAKAGES: tuple[Breakage, ...] = (
    Breakage(
        "finish-ignores-token",
        mixin(FinishIgnoresToken),
        EVERYWHERE,
        ("stale_token_cannot_complete_or_renew", "completion_is_atomic"),
    ),
    Breakage(
        "finish-all-ignores-token",
        mixin(FinishAllIgnoresToken),
        EVERYWHERE,
        ("finish_all_matches_current_tokens",),
    ),
    Breakage(
        "finish-returning-names-all",
        mixin(FinishReturningNamesAll),
        ("postgresql",),
        ("autocommitted_finish_commits_alone",),
    ),
    Breakage(
        "autocommit-left-on",
        fixed(AutocommitLeftOnPostgreSQL),
        ("postgresql",),
        ("autocommitted_finish_commits_alone",),
    ),
    Breakage(
        "renew-ignores-token",
        mixin(RenewIgnoresToken),
        EVERYWHERE,
        ("stale_token_cannot_complete_or_renew",),
    ),
    Breakage("unfenced", mixin(Unfenced), EVERYWHERE, ("takeover_after_lease_expiry",)),
    Breakage("ignores-lease", mixin(IgnoresLease), EVERYWHERE, ("takeover_after_lease_expiry",)),
    Breakage(
        "forgets-takeover-crash",
        mixin(ForgetsTakeoverCrash),
        EVERYWHERE,
        ("takeover_after_lease_expiry",),
    ),
    Breakage(
        "claims-terminal", mixin(ClaimsTerminal), EVERYWHERE, ("terminal_records_never_claimed",)
    ),
    Breakage(
        "ignores-not-before",
        mixin(IgnoresNotBefore),
        EVERYWHERE,
        ("unfinish_delay", "fail_with_retry_delay"),
    ),
    Breakage("retry-uncounted", mixin(RetryUncounted), EVERYWHERE, ("fail_with_retry_delay",)),
    Breakage(
        "release-always-crashes",
        mixin(ReleaseAlwaysCrashes),
        EVERYWHERE,
        ("release_counts_crashes",),
    ),
    Breakage("resets-anything", mixin(ResetsAnything), EVERYWHERE, ("reset_failed",)),
    Breakage(
        # Its own connection would wait for SQLite's write lock, held by the caller.
        "finish-outside-transaction",
        mixin(FinishOutsideTransaction),
        SERVERS,
        ("completion_is_atomic",),
    ),
    Breakage(
        "status-condition-ignores-status",
        mixin(StatusConditionIgnoresStatus),
        EVERYWHERE,
        ("status_condition_gates_dependent_claims",),
    ),
    Breakage(
        "claims-in-key-order",
        mixin(ClaimsInKeyOrder),
        EVERYWHERE,
        ("batch_claims_follow_eligible_order", "racing_claims[ordered]"),
    ),
    Breakage("discovers-once", mixin(DiscoversOnce), EVERYWHERE, ("discovers_later_inserts",)),
    Breakage(
        "watermark-before-discovery",
        mixin(WatermarkBeforeDiscovery),
        EVERYWHERE,
        ("discovery_reports_its_watermark",),
    ),
    Breakage(
        "sweep-is-discover",
        mixin(SweepIsDiscover),
        EVERYWHERE,
        ("sweep_finds_rows_below_watermark",),
    ),
    Breakage(
        "sweep-is-discover",
        mixin(SweepIsDiscover),
        SERVERS,
        ("out_of_order_commits_found_by_sweep",),
    ),
    Breakage(
        "watermark-on-any-key",
        mixin(WatermarkOnAnyKey),
        EVERYWHERE,
        ("non_integer_keys_discovered",),
    ),
    Breakage(
        "cancel-leaves-undiscovered",
        mixin(CancelLeavesUndiscovered),
        EVERYWHERE,
        ("cancel_open_records",),
    ),
    Breakage(
        "cancel-ignores-status",
        mixin(CancelIgnoresStatus),
        EVERYWHERE,
        ("cancel_open_records", "cancel_racing_finish"),
    ),
    Breakage("read-state-shows-token", mixin(ReadStateShowsToken), EVERYWHERE, ("read_state",)),
    Breakage("read-state-shows-pending", mixin(ReadStateShowsPending), EVERYWHERE, ("read_state",)),
    Breakage(
        "ignores-key",
        mixin(IgnoresKey),
        EVERYWHERE,
        ("exclusive_claims_one_per_key",),
    ),
    # The racing check needs two claimers at once, which SQLite's write lock forbids.
    Breakage("ignores-key", mixin(IgnoresKey), SERVERS, ("racing_claims_of_one_key",)),
    Breakage(
        "ending-keeps-key", mixin(EndingKeepsKey), EVERYWHERE, ("exclusive_claims_one_per_key",)
    ),
    Breakage(
        "rate-without-window",
        mixin(RateWithoutWindow),
        EVERYWHERE,
        ("rate_limit_in_window", "rate_limit_per_key"),
    ),
    Breakage("unlocked", fixed(UnlockedPostgreSQL), ("postgresql",), RACING),
    Breakage("no-skip-locked", fixed(WaitingPostgreSQL), ("postgresql",), RACING),
    Breakage("locks-source-rows", fixed(SourceLockingPostgreSQL), ("postgresql",), SOURCE_ROWS),
    Breakage(
        "discovery-locks-source-rows",
        fixed(SourceLockingDiscoveryPostgreSQL),
        ("postgresql",),
        ("discovery_leaves_source_rows_unlocked",),
    ),
    Breakage("unlocked", fixed(UnlockedMySQL), ("mysql",), RACING),
    Breakage(
        "repeatable-read-discovery",
        fixed(RepeatableReadDiscoveryMySQL),
        ("mysql",),
        ("discovery_leaves_source_rows_unlocked",),
    ),
    Breakage(
        "locking-search",
        fixed(LockingSearchMySQL),
        ("mysql",),
        # MariaDB also answers the second claimer with no rows here.
        ("claim_leaves_source_rows_unlocked[ordered]", *RACING),
    ),
    Breakage("over-locking", fixed(OverLockingMySQL), ("mysql",), RACING),
    Breakage(
        "silent-skips",
        fixed(SilentSkipsMySQL),
        ("mysql",),
        ("concurrent_discovery_hides_no_claimable_record",),
    ),
    Breakage("claims-concurrently", fixed(ConcurrentSQLite), ("sqlite",), RACING),
)
