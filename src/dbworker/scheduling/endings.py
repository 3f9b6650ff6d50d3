"""The one path every ending of an item takes.

However an item ends (its handler finished, returned Unfinished, raised; its process
crashed; it timed out, was stopped, vanished, lost its claim), the failure policy
(``core.policy.decide``) picks a row of the transition table, the row is written
through the dialect unless the handler process wrote it in its own transaction, and
the ending's event is reported. Logs (``dbworker.logs.log_event``) and metrics are
listeners of those events: nothing else writes an ending or reports one. The
scheduler and ``drain()`` both conclude items here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from ..core.event_kinds import EventKind
from ..core.policy import Decision, Ending, decide, failure, written
from ..core.tasks import ErrorInfo, Result, ResultKind
from ..dialects import Claim, Dialect, WorkerTable
from ..events import Event, Events
from ..logs import log_event, logs

#: Writes a transition so that it lands eventually (the scheduler's outbox retries it
#: across an outage; ``drain()`` writes at once): what for (its log records), the write,
#: and the item's log attributes.
Write = Callable[[str, Callable[[Connection], object], dict[str, Any] | None], None]
#: A claim, as the dialect recorded it: reported, nothing to write.
CLAIMED = Decision(None, reports=EventKind.CLAIMED)
#: A cancel, as the canceller recorded it (the CANCEL row): reported, nothing to write.
CANCELLED = Decision(None, reports=EventKind.CANCELLED)


@dataclass(frozen=True, slots=True)
class ClaimedItem:
    """An item under one claim, as its ending needs it."""

    worker: str
    table: WorkerTable
    source_id: Any
    token: int
    #: None where the claim is no longer known here (a result read after a takeover).
    attempt: int | None

    @property
    def log_attributes(self) -> dict[str, Any]:
        attempt = "?" if self.attempt is None else self.attempt
        return {"worker": self.worker, "source_id": self.source_id, "attempt": attempt}


class Endings:
    def __init__(self, dialect: Dialect, write: Write, events: Events | None = None) -> None:
        self.dialect = dialect
        self.write = write
        self.events = events if events is not None else Events()

    def conclude(
        self,
        item: ClaimedItem,
        decision: Decision,
        error: ErrorInfo | None = None,
        *,
        recorded: bool = False,
        duration: float | None = None,
        latency: float | None = None,
        says: str | None = None,
        report: bool = True,
    ) -> None:
        """Record ``decision``'s row for ``item`` (unless ``recorded`` already, in the
        handler's transaction) and report its event (unless ``report`` is False: an
        ending reported already, recorded again in case nobody had).

        ``says`` is the event's error text where it is not ``error``'s message.
        """
        transition = decision.transition
        if not recorded and transition is not None:
            table, source_id, token = item.table, item.source_id, item.token
            self.write(
                f"recording {transition.value} of item",
                lambda conn: self.dialect.record(conn, table, source_id, token, decision, error),
                item.log_attributes,
            )
        kind = decision.event
        if kind is None or not report:
            return
        if not self.events and not logs(kind):
            return  # nobody listens: an item's claim and finish cost no Event
        if says is None and error is not None:
            says = error.message
        self.report(Event(kind, item.worker, item.source_id, item.attempt, duration, latency, says))

    def report(self, event: Event) -> None:
        report(self.events, event)

    def result(
        self,
        item: ClaimedItem,
        result: Result,
        *,
        crashes: int,
        max_crashes: int,
        latency: float | None = None,
        report: bool = True,
    ) -> ResultKind:
        """Conclude an invocation from its handler process's ``result``; what it came
        to (an unrecorded failure: FAILED or RETRYING once recorded here).

        ``crashes`` is the record's crash count as claimed; ``report`` False for a run
        this coordinator stopped itself, reported when it stopped it.
        """
        kind = result.kind
        error: ErrorInfo | None = None
        if kind is ResultKind.CRASHED:
            decision = decide(Ending.CRASHED, crashes=crashes, max_crashes=max_crashes)
            error = ErrorInfo(result.error or "crashed", "dbworker.WorkerCrashed")
        elif kind is ResultKind.UNRECORDED:
            # The handler process decided (its retry delay travels with the result) but
            # could not write; a result with no process behind it (an import error) failed.
            decision = failure(result.retry_delay)
            error = ErrorInfo(result.error or "unknown error", result.error_type, result.traceback)
            kind = ResultKind.FAILED if result.retry_delay is None else ResultKind.RETRYING
        else:
            decision = written(kind)
        self.conclude(
            item,
            decision,
            error,
            recorded=error is None,
            duration=result.duration,
            latency=latency,
            says=result.error,
            report=report,
        )
        return kind

    def vanished(self, item: ClaimedItem, claim: Claim, max_crashes: int) -> bool:
        """A new claim of an item whose holders vanished (``claim.crashes``, counted by
        the takeovers): False, and the item FAILED, once they reach ``max_crashes``."""
        decision = decide(Ending.VANISHED, crashes=claim.crashes, max_crashes=max_crashes)
        if decision.transition is None:
            return True
        message = (
            f"the item's holder vanished {claim.crashes} times (lease expired without "
            "renewal); giving up"
        )
        self.conclude(item, decision, ErrorInfo(message, "dbworker.WorkerCrashed"))
        return False


def report(events: Events, event: Event) -> None:
    """Report ``event``: the log listener, then ``events``' listeners. Also for a cancel
    of an item no one ran, reported by the canceller's coordinator (``cancellation``)."""
    log_event(event)
    events.emit(event)
