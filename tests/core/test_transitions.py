"""The pure execution state machine: every legal transition, every illegal one, fencing.

The legal cases are generated from ``TRANSITIONS`` itself, so a row added to the table
without a way to reach it here fails ``test_every_rule_target_is_reachable``; the
illegal cases are its complement over every (phase, event) pair.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from dbworker.core import EventKind, ExecutionStatus, InvalidTransition, Phase, StaleToken
from dbworker.core.policy import Ending, decide
from dbworker.core.status import OPEN, TERMINAL
from dbworker.core.transitions import (
    ERROR,
    INCREMENT,
    KEY,
    LATER,
    NULL,
    OWNER,
    ROWS,
    TRANSITIONS,
    ZERO,
    Record,
    Transition,
    cancel,
    check,
    claim,
    fail,
    finish,
    is_fenced,
    release,
    renew,
    reset_failed,
    sources,
    unfinish,
)
from dbworker.core.transitions import NOW as NOW_VALUE

P, W, U, F, X = Phase.PENDING, Phase.WORKING, Phase.UNFINISHED, Phase.FINISHED, Phase.FAILED

NOW = 1_000.0
LEASE = 30.0
TOKEN = 7
MAX_CRASHES = 3


def crash_release(record: Record, token: int, error: str) -> Record:
    """A crashed holder's release, as the failure policy decides it."""
    decision = decide(Ending.CRASHED, crashes=record.crashes, max_crashes=MAX_CRASHES)
    return release(record, token, error, gives_up=decision.gives_up)


def record_in(phase: Phase) -> Record:
    """A record in ``phase`` that the phase's own events may act on at NOW."""
    base = Record(phase=phase, token=TOKEN, attempts=2, failures=1, crashes=1)
    if phase is W:
        return replace(base, lease_expires_at=NOW + LEASE)  # a live claim
    if phase is U:
        return replace(base, not_before=NOW - 1)  # due
    if phase is X:
        return replace(base, error="ValueError: boom")
    return base


def apply(record: Record, event: Transition, target: Phase) -> Record:
    """Cause ``event`` on ``record``, choosing arguments that should lead to ``target``."""
    if event is Transition.CLAIM:
        return claim(record, NOW, LEASE)
    if event is Transition.TAKEOVER:
        expired = replace(record, lease_expires_at=NOW - 1)
        return claim(expired, NOW, LEASE)
    if event is Transition.RENEW:
        return renew(record, record.token, NOW, LEASE)
    if event is Transition.FINISH:
        return finish(record, record.token)
    if event is Transition.UNFINISH:
        return unfinish(record, record.token, NOW, delay=5.0)
    if event is Transition.FAIL:
        return fail(record, record.token, "ValueError: boom")
    if event is Transition.RETRY:
        return fail(record, record.token, "ValueError: boom", retry_at=NOW + 5.0)
    if event is Transition.RELEASE:
        return release(record, record.token, "stopped", gives_up=False, counts_crash=False)
    if event in (Transition.CRASH, Transition.GIVE_UP):
        crashed = replace(record, crashes=MAX_CRASHES - 1 if event is Transition.GIVE_UP else 0)
        return crash_release(crashed, record.token, "killed")
    if event is Transition.RESET:
        return reset_failed(record)
    if event is Transition.CANCEL:
        return cancel(record, "Cancelled: item cancelled")
    raise AssertionError(f"no way to cause {event}")


LEGAL = sorted(
    (phase, event, target)
    for (phase, event), rule in TRANSITIONS.items()
    for target in rule.targets
)
ILLEGAL = sorted(
    (phase, event)
    for phase, event in itertools.product(Phase, Transition)
    if (phase, event) not in TRANSITIONS
)


def _id(value: object) -> str:
    return str(getattr(value, "value", value))


# -- the table as a specification ----------------------------------------------------------


def test_the_table_is_the_designed_state_machine() -> None:
    # Written out by hand from the state machine's table in docs/internals.md: a change
    # to TRANSITIONS must be a deliberate change to this test (and that table) too.
    assert {key: rule.targets for key, rule in TRANSITIONS.items()} == {
        (P, Transition.CLAIM): {W},
        (U, Transition.CLAIM): {W},
        (W, Transition.TAKEOVER): {W},
        (W, Transition.RENEW): {W},
        (W, Transition.FINISH): {F},
        (W, Transition.UNFINISH): {U},
        (W, Transition.FAIL): {X},
        (W, Transition.RETRY): {U},
        (W, Transition.RELEASE): {U},
        (W, Transition.CRASH): {U},
        (W, Transition.GIVE_UP): {X},
        (X, Transition.RESET): {U},
        (P, Transition.CANCEL): {X},
        (U, Transition.CANCEL): {X},
        (W, Transition.CANCEL): {X},
    }
    fenced = {ev for ev in Transition if is_fenced(ev)}
    assert fenced == set(FENCED_EVENTS)


def test_each_row_sets_what_its_transition_means() -> None:
    """The rows' fields, written out: what each UPDATE and the model write."""
    written = {transition: dict(row.sets) for transition, row in ROWS.items()}
    no_error = dict.fromkeys(("error", "error_type", "traceback"), NULL)
    error = dict.fromkeys(("error", "error_type", "traceback"), ERROR)
    claimed = {
        "token": INCREMENT,
        "lease_expires_at": LATER,
        "not_before": NULL,
        "attempts": INCREMENT,
        "claimed_at": NOW_VALUE,
        "owner_host": OWNER,
        "owner_pid": OWNER,
        "held_key": KEY,
    }
    # Every ending frees the key an exclusive_by worker's record held.
    ended = {"lease_expires_at": NULL, "held_key": NULL}
    assert written == {
        Transition.CLAIM: claimed,
        Transition.TAKEOVER: {"crashes": INCREMENT, **claimed},
        Transition.RENEW: {"lease_expires_at": LATER},
        Transition.FINISH: {**ended, "not_before": NULL, "finished_at": NOW_VALUE, **no_error},
        Transition.UNFINISH: {**ended, "not_before": LATER, **no_error},
        Transition.FAIL: {**ended, **error, "finished_at": NOW_VALUE},
        Transition.RETRY: {**ended, **error, "not_before": LATER, "failures": INCREMENT},
        Transition.RELEASE: {**ended, "not_before": NULL, **error},
        Transition.CRASH: {**ended, "not_before": NULL, **error, "crashes": INCREMENT},
        Transition.GIVE_UP: {**ended, "not_before": NULL, **error, "crashes": INCREMENT},
        Transition.RESET: {
            **ended,
            "not_before": NULL,
            "failures": ZERO,
            "crashes": ZERO,
            **no_error,
            "owner_host": NULL,
            "owner_pid": NULL,
        },
        Transition.CANCEL: {**ended, "not_before": NULL, **error, "finished_at": NOW_VALUE},
    }
    reports = {transition: row.reports for transition, row in ROWS.items()}
    assert reports == {
        Transition.CLAIM: EventKind.CLAIMED,
        Transition.TAKEOVER: EventKind.CLAIMED,
        Transition.RENEW: None,
        Transition.FINISH: EventKind.FINISHED,
        Transition.UNFINISH: EventKind.UNFINISHED,
        Transition.FAIL: EventKind.FAILED,
        Transition.RETRY: EventKind.RETRIED,
        Transition.RELEASE: EventKind.RELEASED,
        Transition.CRASH: EventKind.CRASHED,
        Transition.GIVE_UP: EventKind.CRASHED,
        Transition.RESET: None,
        Transition.CANCEL: EventKind.CANCELLED,
    }


def test_finished_is_terminal() -> None:
    assert [key for key in TRANSITIONS if key[0] is F] == []
    assert {F, X} == TERMINAL
    assert {P, U, W} == OPEN


@pytest.mark.parametrize("event", list(Transition), ids=_id)
def test_sources_are_derived_from_the_table(event: Transition) -> None:
    assert sources(event) == {phase for (phase, ev) in TRANSITIONS if ev is event}
    assert sources(event), f"{event} is legal from no phase"


def test_public_status_of_each_phase() -> None:
    assert P.public is None
    assert [p.public for p in (W, U, F, X)] == [
        ExecutionStatus.WORKING,
        ExecutionStatus.UNFINISHED,
        ExecutionStatus.FINISHED,
        ExecutionStatus.FAILED,
    ]


# -- legal transitions -----------------------------------------------------------------------


@pytest.mark.parametrize(("phase", "event", "target"), LEGAL, ids=_id)
def test_every_rule_target_is_reachable(phase: Phase, event: Transition, target: Phase) -> None:
    before = record_in(phase)
    after = apply(before, event, target)
    assert after.phase is target
    check(phase, event, target)  # the table agrees with the function


@pytest.mark.parametrize(("phase", "event", "target"), LEGAL, ids=_id)
def test_legal_transition_effects(phase: Phase, event: Transition, target: Phase) -> None:
    before = record_in(phase)
    after = apply(before, event, target)
    claiming = event in (Transition.CLAIM, Transition.TAKEOVER)
    # Only a claim hands out a new token; nothing else may change who holds the record.
    assert after.token == (before.token + 1 if claiming else before.token)
    assert after.attempts == (before.attempts + 1 if claiming else before.attempts)
    if after.phase is W:
        assert after.lease_expires_at == NOW + LEASE
    else:
        assert after.lease_expires_at is None
    if event is Transition.FINISH:
        assert after.error is None
    if event in (Transition.FAIL, Transition.RETRY):
        assert after.error == "ValueError: boom"
        assert after.failures == before.failures + (1 if target is U else 0)
        assert after.not_before == (NOW + 5.0 if target is U else before.not_before)
    if event in (Transition.RELEASE, Transition.CRASH, Transition.GIVE_UP):
        assert after.not_before is None
        # apply() starts a crash from 0 crashes, a give-up from one below the limit.
        counted = {Transition.RELEASE: before.crashes, Transition.CRASH: 1}
        assert after.crashes == counted.get(event, MAX_CRASHES)
    if event is Transition.UNFINISH:
        assert after.not_before == NOW + 5.0
    if event is Transition.RESET:
        assert (after.error, after.failures, after.crashes) == (None, 0, 0)
    if event is Transition.CANCEL:
        assert (after.error, after.not_before) == ("Cancelled: item cancelled", None)
        assert after.claimable(NOW + 10 * LEASE) is None  # never claimed until reset


def test_claim_from_nothing_treats_no_record_as_pending() -> None:
    check(None, Transition.CLAIM, W)
    with pytest.raises(InvalidTransition, match="no record"):
        check(None, Transition.FINISH, F)


# -- illegal transitions ---------------------------------------------------------------------


@pytest.mark.parametrize(("phase", "event"), ILLEGAL, ids=_id)
def test_illegal_pairs_are_rejected_by_the_table(phase: Phase, event: Transition) -> None:
    for target in Phase:
        with pytest.raises(InvalidTransition, match=event.value):
            check(phase, event, target)


@pytest.mark.parametrize(("phase", "event"), ILLEGAL, ids=_id)
def test_illegal_events_raise_and_produce_no_record(phase: Phase, event: Transition) -> None:
    record = record_in(phase)
    snapshot = replace(record)
    if event is Transition.TAKEOVER and phase in (P, U):
        # claim() picks CLAIM for these phases; a takeover is never what happens, so
        # no crash is counted however late it is.
        after = claim(replace(record, not_before=None), NOW + 10 * LEASE, LEASE)
        assert after.crashes == record.crashes
        return
    if event is Transition.TAKEOVER:
        # However long after the lease would have run out, nothing is claimable.
        record = replace(record, lease_expires_at=NOW - 1)
        snapshot = replace(record)
    result: object = None
    with pytest.raises(InvalidTransition) as raised:
        result = apply(record, event, W)
    # With the current token, the refusal is about the phase, never about staleness.
    assert type(raised.value) is InvalidTransition
    assert result is None
    assert record == snapshot


def test_claim_is_refused_while_a_lease_is_live() -> None:
    working = record_in(W)
    with pytest.raises(InvalidTransition, match="not claimable"):
        claim(working, NOW, LEASE)


def test_unfinished_is_not_claimable_before_not_before() -> None:
    waiting = replace(record_in(U), not_before=NOW + 5)
    with pytest.raises(InvalidTransition):
        claim(waiting, NOW + 4.999, LEASE)
    assert claim(waiting, NOW + 5, LEASE).phase is W  # due exactly at not_before


# -- tokens and fencing ----------------------------------------------------------------------


FENCED_EVENTS = [
    Transition.RENEW,
    Transition.FINISH,
    Transition.UNFINISH,
    Transition.FAIL,
    Transition.RETRY,
    Transition.RELEASE,
    Transition.CRASH,
    Transition.GIVE_UP,
]


def fenced_call(record: Record, event: Transition, token: int) -> Record:
    if event is Transition.RENEW:
        return renew(record, token, NOW, LEASE)
    if event is Transition.FINISH:
        return finish(record, token)
    if event is Transition.UNFINISH:
        return unfinish(record, token, NOW)
    if event is Transition.FAIL:
        return fail(record, token, "boom")
    if event is Transition.RETRY:
        return fail(record, token, "boom", retry_at=NOW + 5)
    if event is Transition.RELEASE:
        return release(record, token, "stopped", gives_up=False, counts_crash=False)
    if event is Transition.GIVE_UP:
        return release(record, token, "killed", gives_up=True)
    return release(record, token, "killed", gives_up=False)


@pytest.mark.parametrize("event", FENCED_EVENTS, ids=_id)
@pytest.mark.parametrize("stale", [TOKEN - 1, TOKEN + 1, 0], ids=["older", "newer", "zero"])
def test_stale_tokens_raise_and_change_nothing(event: Transition, stale: int) -> None:
    record = record_in(W)
    with pytest.raises(StaleToken, match=f"current is {TOKEN}"):
        fenced_call(record, event, stale)
    assert record == record_in(W)


@pytest.mark.parametrize("event", FENCED_EVENTS, ids=_id)
def test_a_taken_over_holder_is_stale(event: Transition) -> None:
    first = claim(Record(), NOW, LEASE)
    second = claim(first, NOW + LEASE + 1, LEASE)  # the first holder's lease ran out
    assert second.token == first.token + 1
    with pytest.raises(StaleToken):
        fenced_call(second, event, first.token)
    fenced_call(second, event, second.token)  # the new holder is not refused


def test_each_claim_increments_the_token() -> None:
    record = Record()
    tokens = []
    for step in range(4):
        record = claim(record, NOW + step, LEASE)
        tokens.append(record.token)
        record = unfinish(record, record.token, NOW + step)
    assert tokens == [1, 2, 3, 4]
    assert record.attempts == 4


# -- takeover, crashes, release --------------------------------------------------------------


def test_takeover_only_after_lease_expiry_and_counts_a_crash() -> None:
    working = claim(Record(), NOW, LEASE)
    expires = working.lease_expires_at
    assert expires == NOW + LEASE
    for too_early in (NOW, expires - 0.001, expires):  # expiry is strict: < now
        with pytest.raises(InvalidTransition):
            claim(working, too_early, LEASE)
    taken = claim(working, expires + 0.001, LEASE)
    assert (taken.phase, taken.token, taken.crashes) == (W, working.token + 1, 1)
    assert taken.lease_expires_at == expires + 0.001 + LEASE


def test_renewal_moves_the_lease_and_delays_takeover() -> None:
    working = claim(Record(), NOW, LEASE)
    renewed = renew(working, working.token, NOW + 20, LEASE)
    assert renewed.lease_expires_at == NOW + 20 + LEASE
    with pytest.raises(InvalidTransition):
        claim(renewed, NOW + LEASE + 1, LEASE)  # would have expired without the renewal


def test_release_reaches_failed_at_max_crashes() -> None:
    record = Record()
    phases = []
    for attempt in range(MAX_CRASHES):
        record = claim(record, NOW + attempt, LEASE)
        record = crash_release(record, record.token, f"killed {attempt}")
        phases.append(record.phase)
    assert phases == [U, U, X]
    assert (record.crashes, record.error) == (MAX_CRASHES, "killed 2")
    with pytest.raises(InvalidTransition):
        claim(record, NOW + 100, LEASE)  # FAILED is not claimed again


def test_takeovers_and_releases_share_the_crash_budget() -> None:
    record = claim(Record(), NOW, LEASE)
    record = claim(record, NOW + LEASE + 1, LEASE)  # takeover: crash 1
    record = crash_release(record, record.token, "killed")  # crash 2
    assert (record.phase, record.crashes) == (U, 2)
    record = claim(record, NOW + 100, LEASE)
    record = crash_release(record, record.token, "killed")  # crash 3
    assert (record.phase, record.crashes) == (X, 3)


def test_released_item_is_claimable_at_once() -> None:
    record = claim(Record(), NOW, LEASE)
    record = crash_release(record, record.token, "killed")
    assert record.claimable(NOW) is Transition.CLAIM


# -- reset_failed ----------------------------------------------------------------------------


@pytest.mark.parametrize("phase", [p for p in Phase if p is not X], ids=_id)
def test_reset_failed_only_from_failed(phase: Phase) -> None:
    record = record_in(phase)
    with pytest.raises(InvalidTransition, match="reset_failed"):
        reset_failed(record)


def test_reset_failed_makes_the_item_claimable_with_a_clean_slate() -> None:
    record = claim(Record(), NOW, LEASE)
    record = fail(record, record.token, "ValueError: boom")
    assert record.claimable(NOW + 1000) is None
    reset = reset_failed(record)
    assert (reset.phase, reset.error, reset.failures, reset.crashes) == (U, None, 0, 0)
    assert reset.token == record.token  # not a claim: no new holder
    again = claim(reset, NOW + 1, LEASE)
    assert (again.phase, again.token) == (W, record.token + 1)


def test_fail_with_retry_is_unfinished_until_retry_at() -> None:
    record = claim(Record(), NOW, LEASE)
    retrying = fail(record, record.token, "boom", retry_at=NOW + 10)
    assert retrying.claimable(NOW + 9.999) is None
    assert retrying.claimable(NOW + 10) is Transition.CLAIM
