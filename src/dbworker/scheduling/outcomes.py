"""What the scheduler does when an invocation ends: log it, and record what the failure
policy decides where the handler process could not (a crash, a timeout, a stop)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ..core.errors import HandlerTimeout
from ..core.policy import Decision, Ending, decide, failure
from ..core.tasks import ErrorInfo, Result, ResultKind
from ..dialects import Claim, Dialect
from ..events import Event, EventKind, Events
from .outbox import Health, Outbox
from .state import Held, WorkerState

log = logging.getLogger("dbworker")

#: The event each result reports (UNRECORDED depends on the retry it carries).
_RESULT_EVENTS = {
    ResultKind.FINISHED: EventKind.FINISHED,
    ResultKind.UNFINISHED: EventKind.UNFINISHED,
    ResultKind.FAILED: EventKind.FAILED,
    ResultKind.RETRYING: EventKind.RETRIED,
    ResultKind.LOST: EventKind.LOST,
    ResultKind.CRASHED: EventKind.CRASHED,
}


class Outcomes:
    def __init__(
        self,
        outbox: Outbox,
        dialect: Dialect,
        states: Mapping[str, WorkerState],
        health: Health,
        events: Events | None = None,
    ) -> None:
        self.outbox = outbox
        self.dialect = dialect
        self.states = states
        self.health = health
        self.events = events if events is not None else Events()

    def _record(
        self,
        state: WorkerState,
        source_id: Any,
        token: int,
        attempt: int | str,
        decision: Decision,
        error: ErrorInfo,
        description: str,
    ) -> None:
        where, extra = state.item(source_id, attempt)
        table = state.worker.table
        self.outbox.write(
            f"{description} {where}",
            lambda conn: self.dialect.record(conn, table, source_id, token, decision, error),
            extra,
        )

    def handle(self, state: WorkerState, result: Result) -> None:
        """An executor's result for one of ``state``'s invocations."""
        _, source_id, token = result.task_key
        held = state.held.get(source_id)
        if held is not None and held.token == token:
            del state.held[source_id]
        else:
            # Claimed again before this result was read, or a run whose claim was lost.
            held = state.completing.pop((source_id, token), None)
        attempt: int | str = held.attempt if held else "?"
        where, extra = state.item(source_id, attempt)
        kind = result.kind
        self.health.completed += 1
        # A finished item may make another worker's items eligible; look again soon.
        now = time.monotonic()
        for other in self.states.values():
            other.backoff.reset()
            other.next_poll = min(other.next_poll, now)
        # A run this coordinator killed (timeout, lost claim) no longer has its claim
        # held here and was reported when it was killed.
        if self.events and (held is not None or kind is not ResultKind.CRASHED):
            self._report(state, source_id, held, result, now)
        if kind in (ResultKind.FINISHED, ResultKind.UNFINISHED):
            log.info("%s %s in %.3fs", where, kind.value, result.duration, extra=extra)
        elif kind in (ResultKind.FAILED, ResultKind.RETRYING):
            log.warning("%s %s: %s", where, kind.value, result.error, extra=extra)
        elif kind is ResultKind.LOST:
            log.warning("%s lost its claim; its writes were rolled back", where, extra=extra)
        elif kind is ResultKind.UNRECORDED:
            # The handler process decided (its retry delay travels with the result) but
            # could not write; a result with no process behind it (an import error) failed.
            log.warning("%s failed: %s", where, result.error, extra=extra)
            error = ErrorInfo(result.error or "unknown error", result.error_type, result.traceback)
            decision = failure(result.retry_delay)
            self._record(
                state, source_id, token, attempt, decision, error, "recording the failure of"
            )
        elif kind is ResultKind.CRASHED:
            log.error("%s: %s", where, result.error, extra=extra)
            decision = decide(
                Ending.CRASHED,
                crashes=held.crashes if held else 0,
                max_crashes=state.worker.max_crashes,
            )
            error = ErrorInfo(result.error or "crashed", "dbworker.WorkerCrashed")
            self._record(state, source_id, token, attempt, decision, error, "releasing")

    def _report(
        self, state: WorkerState, source_id: Any, held: Held | None, result: Result, now: float
    ) -> None:
        kind = _RESULT_EVENTS.get(result.kind)
        if kind is None:  # UNRECORDED: the handler raised; the result says if it retries
            kind = EventKind.FAILED if result.retry_delay is None else EventKind.RETRIED
        duration = result.duration
        latency = None
        if held is not None and duration is not None:
            latency = max(0.0, now - held.started - duration)
        attempt = held.attempt if held is not None else None
        event = Event(kind, state.worker.name, source_id, attempt, duration, latency, result.error)
        self.events.emit(event)

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
                where, extra = state.item(source_id, held.attempt)
                log.warning("%s timed out after %ss", where, limit, extra=extra)
                if self.events:
                    self.events.emit(
                        Event(
                            EventKind.TIMED_OUT,
                            worker.name,
                            source_id,
                            held.attempt,
                            duration=now - started,
                            error=str(exc),
                        )
                    )
                error = ErrorInfo(f"HandlerTimeout: {exc}", "dbworker.HandlerTimeout")
                self._record(
                    state,
                    source_id,
                    held.token,
                    held.attempt,
                    decision,
                    error,
                    "recording the timeout of",
                )

    def kill_running(self) -> None:
        """Stop every running handler (a stop's deadline passed) and release its item."""
        stopped = decide(Ending.STOPPED)
        error = ErrorInfo("stopped by coordinator shutdown")
        for state in self.states.values():
            for source_id, held in list(state.held.items()):
                if state.executor.kill((state.worker.name, source_id, held.token)):
                    state.held.pop(source_id)
                    where, extra = state.item(source_id, held.attempt)
                    log.warning("%s stopped by coordinator shutdown; released", where, extra=extra)
                    self._record(
                        state, source_id, held.token, held.attempt, stopped, error, "releasing"
                    )

    def withdraw_waiting(self) -> None:
        """Give back the items claimed ahead whose handlers have not started (a stop
        waits for running handlers only): claimable again at once, by anyone."""
        stopped = decide(Ending.STOPPED)
        error = ErrorInfo("claimed ahead; given back by coordinator shutdown")
        for state in self.states.values():
            name = state.worker.name
            for source_id, held in list(state.held.items()):
                key = (name, source_id, held.token)
                if state.executor.started(key) is None and state.executor.kill(key):
                    state.held.pop(source_id)
                    self._record(
                        state, source_id, held.token, held.attempt, stopped, error, "giving back"
                    )

    def claimed(self, state: WorkerState, claim: Claim) -> bool:
        """Take note of a new claim; False when the failure policy gives the item up
        instead of running it (its holder vanished too often)."""
        worker = state.worker
        where, extra = state.item(claim.source_id, claim.attempts)
        previous = state.held.pop(claim.source_id, None)
        if previous is not None and claim.crashes > previous.crashes:
            # A takeover (it counted a crash) of our own expired lease: renewals could
            # not reach the database in time. The earlier run is fenced off now; stop
            # it rather than leave it running untracked beside the new one.
            state.executor.kill((worker.name, claim.source_id, previous.token))
            log.warning(
                "%s took over the item from this coordinator's own expired claim "
                "(attempt %s); the earlier run was stopped",
                where,
                previous.attempt,
                extra=extra,
            )
        elif previous is not None:
            # The earlier run completed (Unfinished, a retry) and its result is on its
            # way: keep it to report under its own attempt.
            state.completing[(claim.source_id, previous.token)] = previous
        decision = decide(Ending.VANISHED, crashes=claim.crashes, max_crashes=worker.max_crashes)
        if decision.event is not None:
            message = (
                f"the item's holder vanished {claim.crashes} times (lease expired without "
                "renewal); giving up"
            )
            log.error("%s failed: %s", where, message, extra=extra)
            error = ErrorInfo(message, "dbworker.WorkerCrashed")
            self._record(
                state, claim.source_id, claim.token, claim.attempts, decision, error, "failing"
            )
            if self.events:
                self.events.emit(
                    Event(
                        EventKind.CRASHED,
                        worker.name,
                        claim.source_id,
                        claim.attempts,
                        error=message,
                    )
                )
            return False
        state.held[claim.source_id] = Held(
            claim.token, claim.attempts, claim.failures, time.monotonic(), claim.crashes
        )
        if self.events:
            self.events.emit(Event(EventKind.CLAIMED, worker.name, claim.source_id, claim.attempts))
        return True

    def lost(self, state: WorkerState, source_id: Any) -> None:
        """A renewal found the claim on ``source_id`` taken over: stop its handler."""
        held = state.held.pop(source_id, None)
        if held is None:
            return
        state.executor.kill((state.worker.name, source_id, held.token))
        where, extra = state.item(source_id, held.attempt)
        log.warning("%s lost its claim; handler stopped", where, extra=extra)
        if self.events:
            self.events.emit(Event(EventKind.LOST, state.worker.name, source_id, held.attempt))
