"""The failure policy: what the end of an invocation does to its execution record.

An invocation ends in one of a few ways (``Ending``); ``decide`` maps that ending,
the record's counters and the worker's retry policy and crash limit to the row of the
transition table to record, its delay and the event to report (``Decision``). It is
the only place these rules live: the handler process, the scheduler, ``drain()`` and a
claim that takes over a vanished holder's item all ask it, the dialects turn its row
into SQL, and the stateful tests use it as their model. Pure: no clock, no I/O;
randomness (retry jitter) only through ``rng``.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from dataclasses import dataclass

from . import transitions
from .event_kinds import EventKind
from .status import Phase
from .tasks import ResultKind
from .timing import RetryPolicy
from .transitions import ROWS, Record, Row, Transition

#: Retries of a handler whose transaction failed on a transient database error
#: (connection lost, deadlock, serialization failure), with or without a retry policy:
#: that failure is the database's doing, not the handler's.
DATABASE_RETRY = RetryPolicy(max_retries=10, base_delay=1.0, max_delay=60.0)


class Ending(enum.StrEnum):
    """How an invocation ended, as far as its record is concerned."""

    FINISHED = "finished"  # the handler returned Finished()
    UNFINISHED = "unfinished"  # the handler returned Unfinished(delay)
    RAISED = "raised"  # the handler (or its transaction) raised
    TIMED_OUT = "timed_out"  # it ran past the worker's timeout and was killed
    CRASHED = "crashed"  # its process died
    STOPPED = "stopped"  # a coordinator stopping with a deadline killed it
    #: A claim took the item over from a holder whose lease expired (the claim has
    #: counted that as a crash already): give up at the crash limit, else run it.
    VANISHED = "vanished"
    LOST = "lost"  # the claim was taken over: the record is someone else's now


@dataclass(frozen=True, slots=True)
class Decision:
    """What to record: a row of the transition table (None: nothing, when the item is
    to run, or is not ours any more), and what the ending reports."""

    transition: Transition | None
    #: Seconds until an UNFINISHED target may be claimed again (the row's ``LATER``).
    delay: float | None = None
    #: The event the ending reports where it is not the row's own (a timeout is
    #: recorded as a failure or a retry, and reported as a timeout).
    reports: EventKind | None = None

    @property
    def row(self) -> Row | None:
        return None if self.transition is None else ROWS[self.transition]

    @property
    def target(self) -> Phase | None:
        row = self.row
        return None if row is None else row.target

    @property
    def gives_up(self) -> bool:
        return self.target is Phase.FAILED

    @property
    def counts_crash(self) -> bool:
        row = self.row
        return row is not None and row.counts_crash

    @property
    def event(self) -> EventKind | None:
        """The event to report: the ending's own, else its row's."""
        if self.reports is not None:
            return self.reports
        row = self.row
        return None if row is None else row.reports


NOTHING = Decision(None)
#: The event each ending reports whatever row it records.
_REPORTS: Mapping[Ending, EventKind] = {
    Ending.TIMED_OUT: EventKind.TIMED_OUT,
    Ending.VANISHED: EventKind.CRASHED,
    Ending.LOST: EventKind.LOST,
}


def decide(
    ending: Ending,
    *,
    failures: int = 0,
    crashes: int = 0,
    retry: RetryPolicy | None = None,
    max_crashes: int = 1,
    error: BaseException | None = None,
    transient: bool = False,
    delay: float = 0.0,
    rng: random.Random | None = None,
) -> Decision:
    """The decision for ``ending``.

    ``failures`` and ``crashes`` are the record's counters as claimed; ``error`` is
    the exception (RAISED, TIMED_OUT), ``transient`` whether the database says it is
    worth retrying, ``delay`` the handler's Unfinished(delay).
    """
    transition, after = _row_for(
        ending, failures, crashes, retry, max_crashes, error, transient, delay, rng
    )
    if transition is None and ending is not Ending.LOST:
        return NOTHING  # the item runs: nothing to record, nothing to report
    return Decision(transition, after, _REPORTS.get(ending))


def _row_for(
    ending: Ending,
    failures: int,
    crashes: int,
    retry: RetryPolicy | None,
    max_crashes: int,
    error: BaseException | None,
    transient: bool,
    delay: float,
    rng: random.Random | None,
) -> tuple[Transition | None, float | None]:
    if ending is Ending.FINISHED:
        return Transition.FINISH, None
    if ending is Ending.UNFINISHED:
        return Transition.UNFINISH, delay
    if ending is Ending.RAISED or ending is Ending.TIMED_OUT:
        if retry is not None and error is not None and retry.applies(error, failures):
            return Transition.RETRY, retry.delay(failures, rng)
        if (
            ending is Ending.RAISED
            and transient
            and error is not None
            and DATABASE_RETRY.applies(error, failures)
        ):
            return Transition.RETRY, DATABASE_RETRY.delay(failures, rng)
        return Transition.FAIL, None
    if ending is Ending.CRASHED:
        # A handler that keeps killing its process must not be retried for ever.
        return (Transition.GIVE_UP if crashes + 1 >= max_crashes else Transition.CRASH), None
    if ending is Ending.STOPPED:
        # Deliberate: claimable again at once, and not the item's fault.
        return Transition.RELEASE, None
    if ending is Ending.VANISHED:
        # The takeover's claim counted the crash already: give up at the limit, else run.
        return (Transition.FAIL if crashes >= max_crashes else None), None
    return None, None  # LOST: the record is someone else's now


def apply(record: Record, token: int, decision: Decision, now: float, error: str) -> Record:
    """The model of recording ``decision`` under ``token`` (what the dialect's SQL does)."""
    if decision.transition is None:
        return record
    later = now + (decision.delay or 0.0)
    return transitions.apply(record, decision.transition, token, later=later, error=error)


def failure(retry_delay: float | None) -> Decision:
    """A failure decided already (by the handler process, which could not record it):
    FAILED, or UNFINISHED for ``retry_delay`` seconds."""
    if retry_delay is None:
        return Decision(Transition.FAIL)
    return Decision(Transition.RETRY, retry_delay)


def written(kind: ResultKind) -> Decision:
    """What a handler process recorded in its own transaction, as the decision it
    carried out: the scheduler reports it without writing anything."""
    return _WRITTEN[kind]


_WRITTEN: Mapping[ResultKind, Decision] = {
    ResultKind.FINISHED: Decision(Transition.FINISH),
    ResultKind.UNFINISHED: Decision(Transition.UNFINISH),
    ResultKind.FAILED: Decision(Transition.FAIL),
    ResultKind.RETRYING: Decision(Transition.RETRY),
    ResultKind.LOST: Decision(None, reports=EventKind.LOST),
}


#: The decision for a handler that returned Finished().
FINISHED = decide(Ending.FINISHED)
