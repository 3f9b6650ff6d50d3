"""The failure policy: what the end of an invocation does to its execution record.

An invocation ends in one of a few ways (``Ending``); ``decide`` maps that ending,
the record's counters and the worker's retry policy and crash limit to the event to
record and its values (``Decision``). It is the only place these rules live: the
handler process, the scheduler and a claim that takes over a vanished holder's item
all ask it, the dialects turn its answer into SQL, and the stateful tests use it as
their model. Pure: no clock, no I/O; randomness (retry jitter) only through ``rng``.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from . import transitions
from .status import Phase
from .timing import RetryPolicy
from .transitions import Record, Transition

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
    """What to record. ``event`` None: nothing (run the item, or it is not ours)."""

    event: Transition | None
    target: Phase | None = None
    #: Seconds until an UNFINISHED target may be claimed again (None: at once).
    delay: float | None = None
    #: Whether the ending counts towards the worker's crash limit.
    counts_crash: bool = False

    @property
    def gives_up(self) -> bool:
        return self.target is Phase.FAILED


NOTHING = Decision(None)


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
    if ending is Ending.FINISHED:
        return Decision(Transition.FINISH, Phase.FINISHED)
    if ending is Ending.UNFINISHED:
        return Decision(Transition.UNFINISH, Phase.UNFINISHED, delay)
    if ending is Ending.RAISED or ending is Ending.TIMED_OUT:
        if retry is not None and error is not None and retry.applies(error, failures):
            return Decision(Transition.FAIL, Phase.UNFINISHED, retry.delay(failures, rng))
        if (
            ending is Ending.RAISED
            and transient
            and error is not None
            and DATABASE_RETRY.applies(error, failures)
        ):
            return Decision(Transition.FAIL, Phase.UNFINISHED, DATABASE_RETRY.delay(failures, rng))
        return Decision(Transition.FAIL, Phase.FAILED)
    if ending is Ending.CRASHED:
        # A handler that keeps killing its process must not be retried for ever.
        target = Phase.FAILED if crashes + 1 >= max_crashes else Phase.UNFINISHED
        return Decision(Transition.RELEASE, target, counts_crash=True)
    if ending is Ending.STOPPED:
        # Deliberate: claimable again at once, and not the item's fault.
        return Decision(Transition.RELEASE, Phase.UNFINISHED)
    if ending is Ending.VANISHED:
        if crashes >= max_crashes:
            return Decision(Transition.FAIL, Phase.FAILED)
        return NOTHING
    return NOTHING  # LOST


def apply(record: Record, token: int, decision: Decision, now: float, error: str) -> Record:
    """The model of recording ``decision`` under ``token`` (what the dialect's SQL does)."""
    if decision.event is Transition.FINISH:
        return transitions.finish(record, token)
    if decision.event is Transition.UNFINISH:
        return transitions.unfinish(record, token, now, decision.delay or 0.0)
    if decision.event is Transition.FAIL:
        retry_at = None if decision.gives_up else now + (decision.delay or 0.0)
        return transitions.fail(record, token, error, retry_at)
    if decision.event is Transition.RELEASE:
        return transitions.release(
            record, token, error, gives_up=decision.gives_up, counts_crash=decision.counts_crash
        )
    return record


def failure(retry_delay: float | None) -> Decision:
    """A failure decided already (by the handler process, which could not record it):
    FAILED, or UNFINISHED for ``retry_delay`` seconds."""
    if retry_delay is None:
        return Decision(Transition.FAIL, Phase.FAILED)
    return Decision(Transition.FAIL, Phase.UNFINISHED, retry_delay)
