"""The failure policy as a table: every way an invocation ends, with the record's
counters and the worker's settings, and what gets recorded."""

from __future__ import annotations

import random
from typing import NamedTuple

import pytest

from dbworker.core import EventKind, RetryPolicy
from dbworker.core.policy import DATABASE_RETRY, Decision, Ending, apply, decide, failure
from dbworker.core.status import Phase
from dbworker.core.transitions import Record, Transition, claim


class Expected(NamedTuple):
    """A decision as the table reads: its row, where it leads, its delay, whether it
    counts a crash, and the event it reports."""

    transition: Transition | None
    target: Phase | None
    delay: float | None = None
    counts_crash: bool = False
    event: EventKind | None = None

    @classmethod
    def of(cls, decision: Decision) -> Expected:
        return cls(
            decision.transition,
            decision.target,
            decision.delay,
            decision.counts_crash,
            decision.event,
        )


RETRY = RetryPolicy(max_retries=2, base_delay=4.0, jitter=0.0)
ONLY_VALUE_ERRORS = RetryPolicy(max_retries=2, base_delay=4.0, jitter=0.0, retry_on=(ValueError,))
BOOM = RuntimeError("boom")
FAILED = Expected(Transition.FAIL, Phase.FAILED, event=EventKind.FAILED)
TIMED_OUT = Expected(Transition.FAIL, Phase.FAILED, event=EventKind.TIMED_OUT)

# (ending, keyword arguments, expected decision)
TABLE: list[tuple[Ending, dict[str, object], Expected]] = [
    (Ending.FINISHED, {}, Expected(Transition.FINISH, Phase.FINISHED, event=EventKind.FINISHED)),
    (
        Ending.UNFINISHED,
        {"delay": 0.0},
        Expected(Transition.UNFINISH, Phase.UNFINISHED, 0.0, event=EventKind.UNFINISHED),
    ),
    (
        Ending.UNFINISHED,
        {"delay": 7.5},
        Expected(Transition.UNFINISH, Phase.UNFINISHED, 7.5, event=EventKind.UNFINISHED),
    ),
    # A handler's exception: FAILED unless a retry policy allows another attempt.
    (Ending.RAISED, {"error": BOOM}, FAILED),
    (
        Ending.RAISED,
        {"error": BOOM, "retry": RETRY},
        Expected(Transition.RETRY, Phase.UNFINISHED, 4.0, event=EventKind.RETRIED),
    ),
    (
        Ending.RAISED,
        {"error": BOOM, "retry": RETRY, "failures": 1},
        Expected(Transition.RETRY, Phase.UNFINISHED, 8.0, event=EventKind.RETRIED),
    ),
    (Ending.RAISED, {"error": BOOM, "retry": RETRY, "failures": 2}, FAILED),
    (Ending.RAISED, {"error": BOOM, "retry": ONLY_VALUE_ERRORS}, FAILED),
    # A transient database error is retried without a policy, and ahead of a policy
    # that does not cover it.
    (
        Ending.RAISED,
        {"error": BOOM, "transient": True, "rng": random.Random(1)},
        Expected(
            Transition.RETRY,
            Phase.UNFINISHED,
            DATABASE_RETRY.delay(0, random.Random(1)),
            event=EventKind.RETRIED,
        ),
    ),
    (
        Ending.RAISED,
        {"error": BOOM, "transient": True, "retry": ONLY_VALUE_ERRORS, "rng": random.Random(2)},
        Expected(
            Transition.RETRY,
            Phase.UNFINISHED,
            DATABASE_RETRY.delay(0, random.Random(2)),
            event=EventKind.RETRIED,
        ),
    ),
    (
        Ending.RAISED,
        {"error": BOOM, "transient": True, "failures": DATABASE_RETRY.max_retries},
        FAILED,
    ),
    # A timeout follows the retry policy, but is never the database's doing.
    (Ending.TIMED_OUT, {"error": BOOM}, TIMED_OUT),
    (Ending.TIMED_OUT, {"error": BOOM, "transient": True}, TIMED_OUT),
    (
        Ending.TIMED_OUT,
        {"error": BOOM, "retry": RETRY},
        Expected(Transition.RETRY, Phase.UNFINISHED, 4.0, event=EventKind.TIMED_OUT),
    ),
    # A crash counts towards the limit and gives up on reaching it.
    (
        Ending.CRASHED,
        {"crashes": 0, "max_crashes": 3},
        Expected(Transition.CRASH, Phase.UNFINISHED, counts_crash=True, event=EventKind.CRASHED),
    ),
    (
        Ending.CRASHED,
        {"crashes": 1, "max_crashes": 3},
        Expected(Transition.CRASH, Phase.UNFINISHED, counts_crash=True, event=EventKind.CRASHED),
    ),
    (
        Ending.CRASHED,
        {"crashes": 2, "max_crashes": 3},
        Expected(Transition.GIVE_UP, Phase.FAILED, counts_crash=True, event=EventKind.CRASHED),
    ),
    (
        Ending.CRASHED,
        {"crashes": 0, "max_crashes": 1},
        Expected(Transition.GIVE_UP, Phase.FAILED, counts_crash=True, event=EventKind.CRASHED),
    ),
    # A stop's deadline is not the item's fault.
    (
        Ending.STOPPED,
        {"crashes": 2, "max_crashes": 3},
        Expected(Transition.RELEASE, Phase.UNFINISHED, event=EventKind.RELEASED),
    ),
    # A takeover has counted its crash already: run it, or give up at the limit.
    (Ending.VANISHED, {"crashes": 2, "max_crashes": 3}, Expected(None, None)),
    (
        Ending.VANISHED,
        {"crashes": 3, "max_crashes": 3},
        Expected(Transition.FAIL, Phase.FAILED, event=EventKind.CRASHED),
    ),
    (Ending.LOST, {"crashes": 5, "max_crashes": 1}, Expected(None, None, event=EventKind.LOST)),
]


@pytest.mark.parametrize(("ending", "arguments", "expected"), TABLE)
def test_decision(ending: Ending, arguments: dict[str, object], expected: Expected) -> None:
    # A generator in the row is copied: the row must give the same answer every run.
    given = arguments.get("rng")
    if isinstance(given, random.Random):
        copy = random.Random()
        copy.setstate(given.getstate())
        arguments = {**arguments, "rng": copy}
    assert Expected.of(decide(ending, **arguments)) == expected  # type: ignore[arg-type]


def test_every_ending_is_in_the_table() -> None:
    assert {ending for ending, _, _ in TABLE} == set(Ending)


def test_retry_jitter_comes_from_the_given_generator() -> None:
    jittery = RetryPolicy(max_retries=1, base_delay=10.0, jitter=0.5)
    first = decide(Ending.RAISED, error=BOOM, retry=jittery, rng=random.Random(7))
    again = decide(Ending.RAISED, error=BOOM, retry=jittery, rng=random.Random(7))
    assert first == again and first.delay is not None and 5.0 <= first.delay <= 15.0


def test_a_failure_decided_elsewhere() -> None:
    assert Expected.of(failure(None)) == FAILED
    assert Expected.of(failure(3.0)) == Expected(
        Transition.RETRY, Phase.UNFINISHED, 3.0, event=EventKind.RETRIED
    )


@pytest.mark.parametrize(("ending", "arguments", "expected"), TABLE)
def test_applying_a_decision_reaches_its_target(
    ending: Ending, arguments: dict[str, object], expected: Expected
) -> None:
    held = claim(Record(), now=100.0, lease_seconds=30.0)
    decision = Decision(expected.transition, expected.delay)
    after = apply(held, held.token, decision, now=110.0, error="boom")
    if expected.transition is None:
        assert after == held
        return
    assert after.phase is expected.target
    if expected.target is Phase.UNFINISHED and expected.delay is not None:
        assert after.not_before == 110.0 + expected.delay
    assert after.crashes == held.crashes + (1 if expected.counts_crash else 0)
    retried = expected.transition is Transition.RETRY
    assert after.failures == held.failures + retried
