"""The scheduler's side of items' endings: which claims it holds, which runs it stops
(timeouts, lost claims, a stop's deadline), and the claims it takes; each ending then
goes the one path of ``scheduling.endings``."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ..core.errors import HandlerTimeout
from ..core.policy import Ending, decide
from ..core.tasks import ErrorInfo, Result, ResultKind
from ..dialects import Claim, Dialect
from ..events import Events
from .endings import CANCELLED, CLAIMED, ClaimedItem, Endings
from .outbox import Deferred, Outbox, SchedulerHealth
from .state import HeldClaim, WorkerState

log = logging.getLogger("dbworker")

#: Results after which the item is not eligible again (a retry, an Unfinished, a crash,
#: an unrecorded outcome or a lost claim may leave it to be claimed again).
ENDED_FOR_GOOD = frozenset({ResultKind.FINISHED, ResultKind.FAILED})


class Outcomes:
    def __init__(
        self,
        outbox: Outbox,
        dialect: Dialect,
        states: Mapping[str, WorkerState],
        health: SchedulerHealth,
        events: Events | None = None,
    ) -> None:
        self.outbox = outbox
        self.states = states
        self.health = health
        self.endings = Endings(dialect, outbox.write, events)

    @staticmethod
    def _item(
        state: WorkerState, source_id: Any, token: int, held: HeldClaim | None
    ) -> ClaimedItem:
        worker = state.worker
        attempt = None if held is None else held.attempt
        return ClaimedItem(worker.name, worker.table, source_id, token, attempt)

    def handle(self, state: WorkerState, result: Result) -> None:
        """An executor's result for one of ``state``'s invocations."""
        _, source_id, token = result.task_key
        held = state.held.get(source_id)
        if held is not None and held.token == token:
            del state.held[source_id]
        else:
            # Claimed again before this result was read, or a run whose claim was lost.
            held = state.completing.pop((source_id, token), None)
        self.health.completed += 1
        # A result may make items eligible: another worker's (its eligible query may read
        # this item's status, or rows its handler wrote), and its own worker's unless the
        # item ended for good, held no limit and no query reads its status. Looking again
        # at once after each of those, a worker with nothing left polled after every
        # batch of results (every 1-5 ms through a wave of them), its transactions taking
        # the database's and the machine's time from the endings under way.
        now = time.monotonic()
        worker = state.worker
        alone = (
            result.kind in ENDED_FOR_GOOD and worker.table.limits is None and not worker.status_read
        )
        for other in self.states.values():
            other.look_again(now, soon=other is not state or not alone)
        latency = None
        if held is not None:
            latency = max(0.0, now - held.started - result.duration)
            if result.kind is ResultKind.LOST and self._was_cancelled(state, source_id, token):
                # Its finish matched nothing because the item was cancelled meanwhile.
                item = self._item(state, source_id, token, held)
                self.endings.conclude(
                    item, CANCELLED, recorded=True, duration=result.duration, latency=latency
                )
                return
        self.endings.result(
            self._item(state, source_id, token, held),
            result,
            crashes=held.crashes if held else 0,
            max_crashes=state.worker.max_crashes,
            latency=latency,
            # A run this coordinator killed (timeout, lost claim, a stop) no longer has
            # its claim held here, and was reported when it was killed.
            report=held is not None,
        )

    def _was_cancelled(self, state: WorkerState, source_id: Any, token: int) -> bool:
        table = state.worker.table
        try:
            found = self.outbox.transaction(
                f"reading the record of a lost claim of worker={state.worker.name}",
                lambda conn: self.endings.dialect.cancelled(conn, table, [(source_id, token)]),
                read_only=True,
            )
        except Deferred:
            return False  # reported as lost: the record says the rest
        return bool(found)

    def enforce_timeouts(self, now: float) -> None:
        for state in self.states.values():
            worker = state.worker
            limit = worker.timeout
            if limit is None:
                continue
            for source_id, held in list(state.held.items()):
                key = (worker.name, source_id, held.token)
                started = state.executor.started(key)
                # Measured from the handler's start: a task claimed ahead is not late.
                if started is None or now - started < limit:
                    continue
                if not state.executor.kill(key):
                    continue
                state.held.pop(source_id)
                exc = HandlerTimeout(
                    f"handler of worker {worker.name!r} ran longer than its timeout "
                    f"of {limit}s and was killed"
                )
                decision = decide(
                    Ending.TIMED_OUT, failures=held.failures, retry=worker.retry, error=exc
                )
                self.endings.conclude(
                    self._item(state, source_id, held.token, held),
                    decision,
                    ErrorInfo(f"HandlerTimeout: {exc}", "dbworker.HandlerTimeout"),
                    duration=now - started,
                    says=str(exc),
                )

    def _give_back(self, waiting_only: bool, error: ErrorInfo) -> None:
        stopped = decide(Ending.STOPPED)
        now = time.monotonic()
        for state in self.states.values():
            for source_id, held in list(state.held.items()):
                key = (state.worker.name, source_id, held.token)
                started = state.executor.started(key)
                if waiting_only and started is not None:
                    continue
                if state.executor.kill(key):
                    state.held.pop(source_id)
                    self.endings.conclude(
                        self._item(state, source_id, held.token, held),
                        stopped,
                        error,
                        duration=None if started is None else now - started,
                    )

    def kill_running(self) -> None:
        """Stop every running handler (a stop's deadline passed) and release its item."""
        self._give_back(False, ErrorInfo("stopped by coordinator shutdown"))

    def withdraw_waiting(self) -> None:
        """Give back the items claimed ahead whose handlers have not started (a stop
        waits for running handlers only): claimable again at once, by anyone."""
        self._give_back(True, ErrorInfo("claimed ahead; given back by coordinator shutdown"))

    def claimed(self, state: WorkerState, claim: Claim) -> bool:
        """Take note of a new claim; False when the failure policy gives the item up
        instead of running it (its holder vanished too often)."""
        worker = state.worker
        previous = state.held.pop(claim.source_id, None)
        if previous is not None and claim.crashes > previous.crashes:
            # A takeover (it counted a crash) of our own expired lease: renewals could
            # not reach the database in time. The earlier run is fenced off now; stop
            # it rather than leave it running untracked beside the new one.
            state.executor.kill((worker.name, claim.source_id, previous.token))
            log.warning(
                "item took over the item from this coordinator's own expired claim "
                "(attempt %s); the earlier run was stopped",
                previous.attempt,
                extra={
                    "worker": worker.name,
                    "source_id": claim.source_id,
                    "attempt": claim.attempts,
                },
            )
        elif previous is not None:
            # The earlier run completed (Unfinished, a retry) and its result is on its
            # way: keep it to report under its own attempt.
            state.completing[(claim.source_id, previous.token)] = previous
        item = ClaimedItem(worker.name, worker.table, claim.source_id, claim.token, claim.attempts)
        # No crash counted (nearly every claim): nothing for the policy to give up.
        if claim.crashes and not self.endings.vanished(item, claim, worker.max_crashes):
            return False
        state.held[claim.source_id] = HeldClaim(
            claim.token, claim.attempts, claim.failures, time.monotonic(), claim.crashes
        )
        self.endings.conclude(item, CLAIMED, recorded=True)
        return True

    def cancelled(self, state: WorkerState, source_id: Any) -> None:
        """``source_id`` was cancelled (``coordinator.cancel``) while held here: stop
        its handler (its transaction rolls back; its fenced finish could not match
        anyway) and report the cancel."""
        held = state.held.pop(source_id, None)
        if held is None:
            return
        state.executor.kill((state.worker.name, source_id, held.token))
        item = self._item(state, source_id, held.token, held)
        self.endings.conclude(item, CANCELLED, recorded=True)

    def lost(self, state: WorkerState, source_id: Any) -> None:
        """A renewal found the claim on ``source_id`` taken over: stop its handler."""
        held = state.held.pop(source_id, None)
        if held is None:
            return
        state.executor.kill((state.worker.name, source_id, held.token))
        item = self._item(state, source_id, held.token, held)
        self.endings.conclude(item, decide(Ending.LOST))
