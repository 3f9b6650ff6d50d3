"""Lease timings, poll backoff and retry policy: pure arithmetic and its validation."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dbworker.core import ConfigurationError, PollBackoff, RetryPolicy, Timings
from dbworker.core.timing import RENEW_FRACTION

# -- Timings -----------------------------------------------------------------------------


def test_timings_defaults_match_the_readme() -> None:
    timings = Timings()
    assert (timings.lease_seconds, timings.poll_seconds, timings.max_poll_seconds) == (
        30.0,
        0.25,
        10.0,
    )
    assert timings.renew_every == pytest.approx(10.0)


def test_timings_accept_equal_poll_and_max_poll() -> None:
    Timings(lease_seconds=1, poll_seconds=0.5, max_poll_seconds=0.5)


NOT_NUMBERS = ["1", None, True, [1], 1j]
NOT_POSITIVE = [0, -1, -0.01, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("field", ["lease_seconds", "poll_seconds", "max_poll_seconds"])
@pytest.mark.parametrize("value", NOT_NUMBERS, ids=repr)
def test_timings_reject_non_numbers(field: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=f"{field} must be a number of seconds"):
        Timings(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["lease_seconds", "poll_seconds", "max_poll_seconds"])
@pytest.mark.parametrize("value", NOT_POSITIVE, ids=repr)
def test_timings_reject_non_positive_or_infinite(field: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=f"{field} must be a finite number > 0"):
        Timings(**{field: value})


def test_max_poll_below_poll_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match=r"max_poll_seconds \(0.5\) must be >= poll"):
        Timings(poll_seconds=1, max_poll_seconds=0.5)


def test_lease_shorter_than_a_second_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="lease_seconds must be at least 1 second"):
        Timings(lease_seconds=0.5)


def test_renewal_is_due_after_a_third_of_the_lease() -> None:
    assert pytest.approx(1 / 3) == RENEW_FRACTION
    # The scheduler renews every renew_every seconds (lease_expiry and renewal_due had
    # no reader but this test, and were removed).
    assert Timings(lease_seconds=30.0).renew_every == pytest.approx(10.0)


# -- PollBackoff -------------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap() -> None:
    backoff = PollBackoff(0.25, 4.0)
    assert [backoff.next_wait() for _ in range(8)] == [0.25, 0.5, 1, 2, 4, 4, 4, 4]


def test_backoff_cap_need_not_be_a_power_of_two_multiple() -> None:
    backoff = PollBackoff(0.3, 1.0)
    assert [backoff.next_wait() for _ in range(5)] == pytest.approx([0.3, 0.6, 1.0, 1.0, 1.0])


def test_backoff_reset_starts_again_from_the_initial_wait() -> None:
    backoff = PollBackoff(0.05, 0.5)
    for _ in range(10):
        backoff.next_wait()
    backoff.reset()
    assert [backoff.next_wait() for _ in range(3)] == pytest.approx([0.05, 0.1, 0.2])


def test_backoff_with_equal_bounds_never_changes() -> None:
    backoff = PollBackoff(1.0, 1.0)
    assert {backoff.next_wait() for _ in range(5)} == {1.0}


# -- RetryPolicy -------------------------------------------------------------------------


class Retryable(Exception):
    pass


def test_retry_applies_until_max_retries_are_used() -> None:
    policy = RetryPolicy(max_retries=2)
    exc = ValueError("boom")
    assert [policy.applies(exc, n) for n in range(4)] == [True, True, False, False]


def test_retry_never_applies_with_zero_retries() -> None:
    assert not RetryPolicy(max_retries=0).applies(ValueError(), 0)


def test_retry_applies_only_to_retry_on_exceptions() -> None:
    policy = RetryPolicy(max_retries=5, retry_on=(Retryable, KeyError))
    assert policy.applies(Retryable(), 0)
    assert policy.applies(KeyError("k"), 0)
    assert not policy.applies(ValueError(), 0)


def test_retry_on_everything_by_default_but_not_base_exceptions() -> None:
    policy = RetryPolicy()
    assert policy.applies(RuntimeError(), 0)
    assert not policy.applies(KeyboardInterrupt(), 0)


class Extremes(random.Random):
    """An rng whose uniform() returns one end of the range: the jitter's bounds."""

    def __init__(self, high: bool) -> None:
        super().__init__(0)
        self.high = high

    def uniform(self, a: float, b: float) -> float:
        return b if self.high else a


def test_delay_doubles_from_base_and_caps_without_jitter() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=10.0, jitter=0.0)
    assert [policy.delay(n) for n in range(6)] == [1, 2, 4, 8, 10, 10]


def test_delay_jitter_reaches_exactly_its_bounds() -> None:
    policy = RetryPolicy(base_delay=2.0, max_delay=100.0, jitter=0.25)
    assert policy.delay(1, rng=Extremes(high=False)) == pytest.approx(4.0 * 0.75)
    assert policy.delay(1, rng=Extremes(high=True)) == pytest.approx(4.0 * 1.25)


def test_delay_is_never_negative_even_with_full_jitter() -> None:
    policy = RetryPolicy(base_delay=1.0, jitter=1.0)
    assert policy.delay(0, rng=Extremes(high=False)) == 0.0


@given(
    failures=st.integers(min_value=0, max_value=60),
    base=st.floats(min_value=0.001, max_value=100),
    cap=st.floats(min_value=0.001, max_value=1000),
    jitter=st.floats(min_value=0, max_value=1),
    seed=st.integers(),
)
def test_delay_stays_within_the_jittered_capped_backoff(
    failures: int, base: float, cap: float, jitter: float, seed: int
) -> None:
    policy = RetryPolicy(base_delay=base, max_delay=cap, jitter=jitter)
    delay = policy.delay(failures, rng=random.Random(seed))
    expected = min(base * 2**failures, cap)
    assert max(0.0, expected * (1 - jitter)) - 1e-9 <= delay <= expected * (1 + jitter) + 1e-9


def test_delay_jitter_spreads_the_retries() -> None:
    policy = RetryPolicy(base_delay=10.0, jitter=0.5)
    rng = random.Random(1)
    delays = {policy.delay(0, rng=rng) for _ in range(50)}
    assert len(delays) > 1
    assert min(delays) < 10.0 < max(delays)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_retries": -1}, "max_retries must be >= 0"),
        ({"max_retries": 1.5}, "max_retries must be an int"),
        ({"max_retries": True}, "max_retries must be an int"),
        ({"base_delay": 0}, "base_delay must be a finite number > 0"),
        ({"base_delay": "1"}, "base_delay must be a number of seconds"),
        ({"max_delay": -1}, "max_delay must be a finite number > 0"),
        ({"max_delay": math.inf}, "max_delay must be a finite number > 0"),
        ({"jitter": -0.1}, "jitter must be between 0 and 1"),
        ({"jitter": 1.5}, "jitter must be between 0 and 1"),
        ({"jitter": math.nan}, "jitter must be between 0 and 1"),
        ({"jitter": "0.1"}, "jitter must be between 0 and 1"),
        ({"jitter": None}, "jitter must be between 0 and 1"),
        ({"retry_on": ()}, "retry_on must be a non-empty tuple of exception classes"),
        ({"retry_on": (ValueError, "KeyError")}, "retry_on must be a non-empty tuple"),
        ({"retry_on": (int,)}, "retry_on must be a non-empty tuple"),
    ],
    ids=lambda value: repr(value) if isinstance(value, dict) else "",
)
def test_retry_policy_validation(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**options)  # type: ignore[arg-type]
