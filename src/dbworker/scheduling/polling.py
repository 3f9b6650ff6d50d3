"""One worker's poll: discovery when due and the claim, in one transaction, the claims
handed to its executor, then the sweeps due; and when it polls next."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from ..core.timing import Timings
from ..dialects import Claim, Claims, Dialect, Owner
from ..worker import Registration
from .outbox import Deferred, Outbox, SchedulerHealth
from .outcomes import Outcomes
from .state import WorkerState

log = logging.getLogger("dbworker")


@dataclass(slots=True)
class Polls:
    """The scheduler's polls of its workers (``Scheduler``: when each is due)."""

    outbox: Outbox
    dialect: Dialect
    timings: Timings
    owner: Owner
    health: SchedulerHealth
    outcomes: Outcomes

    def poll(self, state: WorkerState, now: float) -> None:
        """Discover (when due) and claim for ``state``'s worker, which has free slots;
        hand the claims to its executor."""
        worker = state.worker
        state.polled_at = now
        try:
            above = state.discovery.probe_above(now)
            if above is not None and not self.outbox.transaction(
                f"probing for work of worker={worker.name}",
                lambda conn: self.dialect.probe(conn, worker.table, above),
                read_only=True,
            ):
                state.next_poll = now + state.backoff.next_wait()
                return
            discovered = state.discovery.due(now)
            free = state.executor.free_slots()
            # Nothing of it in flight: whatever it claims now starts at once in an idle
            # process, so its rows are read with the claim, and that process (idle, its
            # connection cold) sends no read of its own (``Task.row``).
            quiet = not state.held and state.executor.uses_rows and worker.reads_rows
            rows: dict[Any, tuple[Any, ...]] = {}

            def discover_and_claim(conn: Connection) -> tuple[Any, Sequence[Claim]]:
                # One transaction, one COMMIT: after a wake-up, discovery's own commit
                # was most of the time from the wake-up to the claim.
                found = (
                    state.discovery.discover(conn, self.dialect, worker.table, claim_follows=True)
                    if discovered
                    else None
                )
                claimed = self.dialect.claim(
                    conn,
                    worker.table,
                    worker.eligible_query(),
                    free,
                    self.timings.lease_seconds,
                    self.owner,
                )
                if quiet and claimed:
                    starting = [claim.source_id for claim in claimed[: worker.concurrency]]
                    rows.update(self._rows_of(worker, conn, starting))
                return found, claimed

            found, claims = self.outbox.transaction(
                f"discovering and claiming for worker={worker.name}"
                if discovered
                else f"claiming for worker={worker.name}",
                discover_and_claim,
            )
            if discovered:
                state.discovery.discovered(found, now, self.dialect.discovery_batch)
        except Deferred:
            state.next_poll = max(self.outbox.blocked_until, now + state.backoff.next_wait())
            return
        self._claimed(state, claims, free, discovered, rows, now)
        if discovered:
            # After the claim, its tasks on their way: a sweep looks for rows committed
            # out of key order, and ahead of the claim its transaction (3.3 ms on
            # PostgreSQL) held up the rows a wake-up announced, every fifth second.
            self.sweep(state, now)

    def _claimed(
        self,
        state: WorkerState,
        claims: Sequence[Claim],
        free: int,
        discovered: bool,
        rows: dict[Any, tuple[Any, ...]],
        now: float,
    ) -> None:
        worker = state.worker
        skipped = claims.skipped if isinstance(claims, Claims) else 0
        if len(claims) < free:
            state.discovery.ran_short(now)  # known work ran short: look for new rows
        elif discovered:
            state.discovery.claims_full(now, self.timings.poll_seconds)
        state.discovery.idle = not claims and not skipped
        if not skipped:
            state.contention.reset()
        if not claims:
            waits = state.contention if skipped else state.backoff
            state.next_poll = now + waits.next_wait()
            return
        state.backoff.reset()
        state.next_poll = now
        self.health.claimed += len(claims)
        state.discovery.took(len(claims))
        state.executor.submit_all(
            [
                worker.task(claim, rows.get(claim.source_id))
                for claim in claims
                if self.outcomes.claimed(state, claim)
            ]
        )

    def sweep(self, state: WorkerState, now: float) -> None:
        """The sweeps due for ``state``'s worker; what they add is claimed at once."""
        try:
            added = state.discovery.sweep(self.outbox, self.dialect, state.worker.table, now)
        except Deferred:
            state.next_poll = max(self.outbox.blocked_until, now + state.backoff.next_wait())
            return
        if added:
            state.poll_now(now)  # not idle, and discovery due

    def _rows_of(
        self, worker: Registration, conn: Connection, keys: list[Any]
    ) -> dict[Any, tuple[Any, ...]]:
        """``worker.source_rows`` of ``keys``, after its claim on ``conn``. A failed read
        never fails the claim (which on PostgreSQL's scheduler connection has committed
        already): its tasks then carry no rows, and after an error that is not
        transient the worker's never do again."""
        try:
            with self.dialect.autocommitting(conn) as alone:
                # Alone where the claim committed by itself; else in its transaction,
                # with a savepoint where a failed statement would abort all of it.
                if alone or not self.dialect.failed_statement_aborts_transaction:
                    return worker.source_rows(conn, keys)
            with conn.begin_nested():
                return worker.source_rows(conn, keys)
        except Exception as exc:
            if not self.dialect.is_transient(exc):
                log.warning(
                    "dbworker: worker %r: reading source rows with its claims failed; "
                    "its handler processes read them from now on",
                    worker.name,
                    exc_info=exc,
                )
                worker.stop_reading_rows()
            return {}
