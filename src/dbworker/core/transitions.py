"""The execution state machine, as data.

One record per (worker, source row). ``ROWS`` is the whole specification: for each
transition, the phases it may leave, the phase it leads to, whether only the holder
of the current token may cause it (*fenced*), the record fields it sets and the event
it reports. What runs reads this table and nothing else:

- the dialects build each fenced UPDATE from a row (``WHERE`` the phases it leaves
  and, when fenced, the token; ``SET`` its fields), and their claims from the CLAIM
  and TAKEOVER rows;
- ``apply`` below is the pure model of a row, which the stateful tests hold every
  dialect's SQL to;
- the scheduler, ``drain()`` and the handler processes pick a row through the failure
  policy (``core.policy``) and report the row's event.

Adding an ending is one row here plus its test. Nothing here reads a clock: ``now``
is always an argument (seconds since the epoch, on the database's clock).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import InvalidTransition, StaleToken
from .event_kinds import EventKind
from .status import Phase


class Transition(enum.StrEnum):
    CLAIM = "claim"  # a pending or due unfinished record is claimed
    TAKEOVER = "takeover"  # a working record whose lease expired is claimed
    RENEW = "renew"
    FINISH = "finish"  # the handler returned Finished()
    UNFINISH = "unfinish"  # the handler returned Unfinished(delay)
    FAIL = "fail"  # an error, and no retry left
    RETRY = "retry"  # an error, and the retry policy runs the item again later
    RELEASE = "release"  # given back unharmed (a stop): claimable at once, not counted
    CRASH = "crash"  # its process died: claimable at once, counted as a crash
    GIVE_UP = "give_up"  # its process died once too often (the crash limit): FAILED
    RESET = "reset"  # reset_failed
    CANCEL = "cancel"  # coordinator.cancel(): never runs (again) until reset_failed


class Value(enum.Enum):
    """What a row sets a field to; the dialects write it as SQL, ``apply`` as a number."""

    NOW = "now"  # the database's clock when the statement runs
    LATER = "later"  # now plus the transition's delay (Unfinished's, a retry's, a lease)
    NULL = "null"
    ZERO = "zero"
    INCREMENT = "increment"  # the field's current value plus one
    ERROR = "error"  # the error's text for the field: its message, type or traceback
    OWNER = "owner"  # the claiming coordinator's host or process id
    KEY = "key"  # the source row's exclusive_by key, as a string (core.limits)


NOW, LATER, NULL, ZERO = Value.NOW, Value.LATER, Value.NULL, Value.ZERO
INCREMENT, ERROR, OWNER, KEY = Value.INCREMENT, Value.ERROR, Value.OWNER, Value.KEY

#: The fields that hold an error, each set from its part of the error (``ERROR``).
ERROR_FIELDS = ("error", "error_type", "traceback")


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the state machine."""

    transition: Transition
    sources: frozenset[Phase]
    target: Phase
    fenced: bool
    #: Field -> value, in the order the UPDATE sets them (``status`` and ``updated_at``
    #: are set by every row that changes the phase, and are not listed).
    sets: Mapping[str, Value]
    #: The event an item reaching this row reports (None: no event of its own).
    reports: EventKind | None
    guard: str = "-"  # human-readable, for error messages and docs

    @property
    def counts_crash(self) -> bool:
        return self.sets.get("crashes") is INCREMENT


W, U, F, X, P = Phase.WORKING, Phase.UNFINISHED, Phase.FINISHED, Phase.FAILED, Phase.PENDING


def _row(
    transition: Transition,
    sources: Iterable[Phase],
    target: Phase,
    *,
    fenced: bool,
    sets: Mapping[str, Value],
    reports: EventKind | None,
    guard: str = "-",
) -> Row:
    return Row(transition, frozenset(sources), target, fenced, dict(sets), reports, guard)


#: A claim's fields. MySQL evaluates SET left to right with already-updated values, so
#: a field that depends on the old status (a takeover's crash count) must come first.
_CLAIMED = {
    "token": INCREMENT,
    "lease_expires_at": LATER,
    "not_before": NULL,
    "attempts": INCREMENT,
    "claimed_at": NOW,
    "owner_host": OWNER,
    "owner_pid": OWNER,
    # Only a worker with ``exclusive_by`` has this column (a unique index over it is
    # what keeps two records of one key from being WORKING at once); elsewhere the
    # dialects leave it out of their statements.
    "held_key": KEY,
}
_NO_ERROR = dict.fromkeys(ERROR_FIELDS, NULL)
_WITH_ERROR = dict.fromkeys(ERROR_FIELDS, ERROR)
#: Every row that leaves WORKING ends the lease and frees the key it held.
_ENDED = {"lease_expires_at": NULL, "held_key": NULL}

ROWS: Mapping[Transition, Row] = {
    row.transition: row
    for row in (
        _row(
            Transition.CLAIM,
            (P, U),
            W,
            fenced=False,
            sets=_CLAIMED,
            reports=EventKind.CLAIMED,
            guard="eligible; an UNFINISHED record once not_before <= now",
        ),
        # A takeover means the previous holder vanished: count it as a crash, so a
        # handler that kills its coordinator is bounded by the crash limit.
        _row(
            Transition.TAKEOVER,
            (W,),
            W,
            fenced=False,
            sets={"crashes": INCREMENT, **_CLAIMED},
            reports=EventKind.CLAIMED,
            guard="eligible and lease expired",
        ),
        _row(
            Transition.RENEW, (W,), W, fenced=True, sets={"lease_expires_at": LATER}, reports=None
        ),
        _row(
            Transition.FINISH,
            (W,),
            F,
            fenced=True,
            sets={**_ENDED, "not_before": NULL, "finished_at": NOW, **_NO_ERROR},
            reports=EventKind.FINISHED,
        ),
        _row(
            Transition.UNFINISH,
            (W,),
            U,
            fenced=True,
            sets={**_ENDED, "not_before": LATER, **_NO_ERROR},
            reports=EventKind.UNFINISHED,
        ),
        _row(
            Transition.FAIL,
            (W,),
            X,
            fenced=True,
            sets={**_ENDED, **_WITH_ERROR, "finished_at": NOW},
            reports=EventKind.FAILED,
            guard="no retry left",
        ),
        _row(
            Transition.RETRY,
            (W,),
            U,
            fenced=True,
            sets={**_ENDED, **_WITH_ERROR, "not_before": LATER, "failures": INCREMENT},
            reports=EventKind.RETRIED,
            guard="the retry policy allows another attempt",
        ),
        _row(
            Transition.RELEASE,
            (W,),
            U,
            fenced=True,
            sets={**_ENDED, "not_before": NULL, **_WITH_ERROR},
            reports=EventKind.RELEASED,
        ),
        _row(
            Transition.CRASH,
            (W,),
            U,
            fenced=True,
            sets={**_ENDED, "not_before": NULL, **_WITH_ERROR, "crashes": INCREMENT},
            reports=EventKind.CRASHED,
            guard="below the crash limit",
        ),
        _row(
            Transition.GIVE_UP,
            (W,),
            X,
            fenced=True,
            sets={**_ENDED, "not_before": NULL, **_WITH_ERROR, "crashes": INCREMENT},
            reports=EventKind.CRASHED,
            guard="at the crash limit",
        ),
        _row(
            Transition.RESET,
            (X,),
            U,
            fenced=False,
            sets={
                **_ENDED,
                "not_before": NULL,
                "failures": ZERO,
                "crashes": ZERO,
                **_NO_ERROR,
                "owner_host": NULL,
                "owner_pid": NULL,
            },
            reports=None,
        ),
        # Unfenced: the canceller holds no token. A holder's fenced finish and this
        # guarded UPDATE meet on one row, so exactly one of them wins; the holder finds
        # out (its renewal, or its finish, no longer matches) and stops its handler.
        _row(
            Transition.CANCEL,
            (P, U, W),
            X,
            fenced=False,
            sets={**_ENDED, "not_before": NULL, **_WITH_ERROR, "finished_at": NOW},
            reports=EventKind.CANCELLED,
            guard="not finished or failed",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Rule:
    """The transition table by (phase, transition): where it leads, whether fenced."""

    targets: frozenset[Phase]
    fenced: bool
    guard: str


#: ``ROWS`` keyed by the phase left: the legal (phase, transition) pairs.
TRANSITIONS: Mapping[tuple[Phase, Transition], Rule] = {
    (phase, row.transition): Rule(frozenset({row.target}), row.fenced, row.guard)
    for row in ROWS.values()
    for phase in sorted(row.sources)
}


def sources(transition: Transition) -> frozenset[Phase]:
    """The phases ``transition`` may leave: the SQL ``status IN (...)`` guard."""
    return frozenset(phase for (phase, ev) in TRANSITIONS if ev is transition)


def is_fenced(transition: Transition) -> bool:
    return any(rule.fenced for (_, ev), rule in TRANSITIONS.items() if ev is transition)


def sets_status(row: Row) -> bool:
    """Whether the row's UPDATE writes ``status`` (a renewal leaves the phase alone)."""
    return row.sources != {row.target}


def check(phase: Phase | None, transition: Transition, target: Phase) -> None:
    """Raise InvalidTransition unless ``phase --transition--> target`` is in the table.

    ``None`` (no record yet) behaves as PENDING: discovery is not a transition.
    """
    rule = TRANSITIONS.get((phase or Phase.PENDING, transition))
    if rule is None:
        raise InvalidTransition(f"{transition.value} is not allowed from {phase or 'no record'}")
    if target not in rule.targets:
        raise InvalidTransition(
            f"{transition.value} from {phase or 'no record'} cannot lead to {target.value}"
        )


@dataclass(frozen=True, slots=True)
class Record:
    """The pure model of one execution record (what the SQL row means)."""

    phase: Phase = Phase.PENDING
    token: int = 0
    lease_expires_at: float | None = None
    not_before: float | None = None
    attempts: int = 0
    failures: int = 0
    crashes: int = 0
    error: str | None = None

    def claimable(self, now: float) -> Transition | None:
        """The claiming transition this record admits at ``now`` (eligibility aside)."""
        if self.phase is Phase.PENDING:
            return Transition.CLAIM
        if self.phase is Phase.UNFINISHED and (self.not_before is None or self.not_before <= now):
            return Transition.CLAIM
        if (
            self.phase is Phase.WORKING
            and self.lease_expires_at is not None
            and self.lease_expires_at < now
        ):
            return Transition.TAKEOVER
        return None


#: The fields of the model; a row's other fields (timestamps, owner, the error's
#: type and traceback) are the dialect's alone.
_MODELLED = frozenset(f.name for f in fields(Record))


def apply(
    record: Record,
    transition: Transition,
    token: int | None = None,
    *,
    later: float | None = None,
    error: str | None = None,
) -> Record:
    """The model of ``transition``'s row on ``record``: what its UPDATE must do.

    ``token`` is the holder's (fenced rows); ``later`` the time ``LATER`` stands for
    (now plus the delay); ``error`` the message an ``ERROR`` field takes. Raises
    InvalidTransition from a phase the row does not leave and StaleToken for a
    fenced row under another token, changing nothing.
    """
    row = ROWS[transition]
    if record.phase not in row.sources:
        raise InvalidTransition(f"{transition.value} is not allowed from {record.phase.value}")
    if row.fenced and token != record.token:
        raise StaleToken(f"{transition.value} with token {token}, current is {record.token}")
    changes: dict[str, Any] = {"phase": row.target}
    for name, value in row.sets.items():
        if name not in _MODELLED:
            continue
        if value is INCREMENT:
            changes[name] = getattr(record, name) + 1
        elif value is LATER:
            if later is None:
                raise ValueError(f"{transition.value} needs the time LATER stands for")
            changes[name] = later
        elif value is NULL:
            changes[name] = None
        elif value is ZERO:
            changes[name] = 0
        elif value is ERROR:
            changes[name] = error
        else:  # NOW, OWNER and KEY: only fields the model does not hold take them
            raise AssertionError(f"the model holds no {value.name} field ({name})")
    return replace(record, **changes)


def claim(record: Record, now: float, lease_seconds: float) -> Record:
    """Claim (or take over) a record: a new token and a fresh lease."""
    transition = record.claimable(now)
    if transition is None:
        raise InvalidTransition(f"record in {record.phase.value} is not claimable at {now}")
    return apply(record, transition, later=now + lease_seconds)


def renew(record: Record, token: int, now: float, lease_seconds: float) -> Record:
    return apply(record, Transition.RENEW, token, later=now + lease_seconds)


def finish(record: Record, token: int) -> Record:
    return apply(record, Transition.FINISH, token)


def unfinish(record: Record, token: int, now: float, delay: float = 0.0) -> Record:
    return apply(record, Transition.UNFINISH, token, later=now + delay)


def fail(record: Record, token: int, error: str, retry_at: float | None = None) -> Record:
    """Record a handler error: FAILED, or UNFINISHED until ``retry_at`` when a retry is left."""
    if retry_at is None:
        return apply(record, Transition.FAIL, token, error=error)
    return apply(record, Transition.RETRY, token, later=retry_at, error=error)


def release(
    record: Record, token: int, error: str, *, gives_up: bool, counts_crash: bool = True
) -> Record:
    """The holder gave the item up (its process died, or was stopped): claimable again
    at once, or FAILED when the failure policy gives up (``policy.decide``)."""
    return apply(
        record, releasing(gives_up=gives_up, counts_crash=counts_crash), token, error=error
    )


def releasing(*, gives_up: bool, counts_crash: bool) -> Transition:
    """The row of an item given up by its holder: at the crash limit, a crash, or a stop."""
    if gives_up:
        if not counts_crash:
            raise ValueError("giving up is for crashes: the crash limit counts them")
        return Transition.GIVE_UP
    return Transition.CRASH if counts_crash else Transition.RELEASE


def cancel(record: Record, error: str) -> Record:
    """Cancel an open record (pending, unfinished or working): FAILED with ``error``."""
    return apply(record, Transition.CANCEL, error=error)


def reset_failed(record: Record) -> Record:
    if record.phase is not Phase.FAILED:
        raise InvalidTransition(f"reset_failed is not allowed from {record.phase.value}")
    return apply(record, Transition.RESET)
