"""The execution state machine, as data.

One record per (worker, source row). ``TRANSITIONS`` is the whole specification:
which events are legal from which phase, which phases they can lead to, and
whether the event is *fenced* (only the holder of the current token may cause
it). The dialects derive their SQL guards from this table, and the stateful
tests use the pure functions below as the model the SQL is checked against.

Nothing here reads a clock: ``now`` is always an argument (seconds since the
epoch, on the database's clock).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from .errors import InvalidTransition, StaleToken
from .status import Phase


class Transition(enum.StrEnum):
    CLAIM = "claim"  # a pending or due unfinished record is claimed
    TAKEOVER = "takeover"  # a working record whose lease expired is claimed
    RENEW = "renew"
    FINISH = "finish"
    UNFINISH = "unfinish"
    FAIL = "fail"
    RELEASE = "release"  # the holder's process died (or was stopped) mid-handler
    RESET = "reset"  # reset_failed


@dataclass(frozen=True, slots=True)
class Rule:
    targets: frozenset[Phase]
    fenced: bool
    guard: str  # human-readable, for error messages and docs


def _rule(*targets: Phase, fenced: bool, guard: str = "-") -> Rule:
    return Rule(frozenset(targets), fenced, guard)


W, U, F, X, P = Phase.WORKING, Phase.UNFINISHED, Phase.FINISHED, Phase.FAILED, Phase.PENDING

TRANSITIONS: Mapping[tuple[Phase, Transition], Rule] = {
    (P, Transition.CLAIM): _rule(W, fenced=False, guard="row is eligible"),
    (U, Transition.CLAIM): _rule(W, fenced=False, guard="eligible and not_before <= now"),
    (W, Transition.TAKEOVER): _rule(W, fenced=False, guard="eligible and lease expired"),
    (W, Transition.RENEW): _rule(W, fenced=True),
    (W, Transition.FINISH): _rule(F, fenced=True),
    (W, Transition.UNFINISH): _rule(U, fenced=True),
    (W, Transition.FAIL): _rule(X, U, fenced=True, guard="UNFINISHED only if a retry is left"),
    (W, Transition.RELEASE): _rule(U, X, fenced=True, guard="FAILED past the crash limit"),
    (X, Transition.RESET): _rule(U, fenced=False),
}


def sources(event: Transition) -> frozenset[Phase]:
    """The phases from which ``event`` is legal: the SQL ``status IN (...)`` guard."""
    return frozenset(phase for (phase, ev) in TRANSITIONS if ev is event)


def is_fenced(event: Transition) -> bool:
    return any(rule.fenced for (_, ev), rule in TRANSITIONS.items() if ev is event)


def check(phase: Phase | None, event: Transition, target: Phase) -> None:
    """Raise InvalidTransition unless ``phase --event--> target`` is in the table.

    ``None`` (no record yet) behaves as PENDING: discovery is not an event.
    """
    rule = TRANSITIONS.get((phase or Phase.PENDING, event))
    if rule is None:
        raise InvalidTransition(f"{event.value} is not allowed from {phase or 'no record'}")
    if target not in rule.targets:
        raise InvalidTransition(
            f"{event.value} from {phase or 'no record'} cannot lead to {target.value}"
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
        """The claiming event this record admits at ``now`` (eligibility aside)."""
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


def _fence(record: Record, event: Transition, token: int) -> None:
    if (record.phase, event) not in TRANSITIONS:
        raise InvalidTransition(f"{event.value} is not allowed from {record.phase.value}")
    if token != record.token:
        raise StaleToken(f"{event.value} with token {token}, current is {record.token}")


def claim(record: Record, now: float, lease_seconds: float) -> Record:
    """Claim (or take over) a record: a new token and a fresh lease."""
    event = record.claimable(now)
    if event is None:
        raise InvalidTransition(f"record in {record.phase.value} is not claimable at {now}")
    check(record.phase, event, Phase.WORKING)
    return replace(
        record,
        phase=Phase.WORKING,
        token=record.token + 1,
        lease_expires_at=now + lease_seconds,
        not_before=None,
        attempts=record.attempts + 1,
        crashes=record.crashes + (1 if event is Transition.TAKEOVER else 0),
    )


def renew(record: Record, token: int, now: float, lease_seconds: float) -> Record:
    _fence(record, Transition.RENEW, token)
    return replace(record, lease_expires_at=now + lease_seconds)


def finish(record: Record, token: int) -> Record:
    _fence(record, Transition.FINISH, token)
    return replace(record, phase=Phase.FINISHED, lease_expires_at=None, error=None)


def unfinish(record: Record, token: int, now: float, delay: float = 0.0) -> Record:
    _fence(record, Transition.UNFINISH, token)
    return replace(
        record,
        phase=Phase.UNFINISHED,
        lease_expires_at=None,
        not_before=now + delay,
        error=None,
    )


def fail(record: Record, token: int, error: str, retry_at: float | None = None) -> Record:
    """Record a handler error: FAILED, or UNFINISHED until ``retry_at`` when a retry is left."""
    _fence(record, Transition.FAIL, token)
    if retry_at is None:
        return replace(record, phase=Phase.FAILED, lease_expires_at=None, error=error)
    return replace(
        record,
        phase=Phase.UNFINISHED,
        lease_expires_at=None,
        not_before=retry_at,
        failures=record.failures + 1,
        error=error,
    )


def release(
    record: Record, token: int, error: str, *, gives_up: bool, counts_crash: bool = True
) -> Record:
    """The holder gave the item up (its process died, or was stopped): claimable again
    at once, or FAILED when the failure policy gives up (``policy.decide``)."""
    _fence(record, Transition.RELEASE, token)
    return replace(
        record,
        phase=Phase.FAILED if gives_up else Phase.UNFINISHED,
        lease_expires_at=None,
        not_before=None,
        crashes=record.crashes + (1 if counts_crash else 0),
        error=error,
    )


def reset_failed(record: Record) -> Record:
    if record.phase is not Phase.FAILED:
        raise InvalidTransition(f"reset_failed is not allowed from {record.phase.value}")
    return replace(
        record,
        phase=Phase.UNFINISHED,
        lease_expires_at=None,
        not_before=None,
        failures=0,
        crashes=0,
        error=None,
    )
