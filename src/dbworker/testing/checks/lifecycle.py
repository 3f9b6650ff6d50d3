"""Conformance checks of a record after its claim: terminal states and the way back,
delays, retries and crashes, and what ``read_state`` shows of it."""

from __future__ import annotations

from collections.abc import Iterable

from ...core.policy import Ending, decide
from ...core.status import ExecutionStatus, Phase
from ..harness import ERROR, LEASE, DialectFactory, Harness, utc
from .common import STOPPED, status_of


def check_terminal_records_never_claimed(make_dialect: DialectFactory, url: str) -> None:
    """FINISHED and FAILED records are never claimed again, however much time passes."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        done, failed = h.claim_one(h.items, 1), h.claim_one(h.items, 2)
        with h.transaction() as conn:
            assert h.dialect.finish(conn, h.items, 1, done.token)
            assert h.dialect.fail(conn, h.items, 2, failed.token, ERROR)
        terminal = {1: h.record(h.items, 1), 2: h.record(h.items, 2)}
        assert terminal[1] is not None and terminal[1]["status"] == Phase.FINISHED.value
        assert terminal[2] is not None and terminal[2]["status"] == Phase.FAILED.value
        for jump in (0, LEASE + 1, 24 * 3600, 10 * 365 * 24 * 3600):
            h.clock.advance(jump)
            got = h.claimable(h.items)
            assert not {1, 2} & set(got), f"terminal records claimed after {jump}s: {got}"
            assert {3, 4} <= set(got), "the other records must stay claimable"
        assert {i: h.record(h.items, i) for i in (1, 2)} == terminal


def check_reset_failed(make_dialect: DialectFactory, url: str) -> None:
    """reset_failed turns FAILED into claimable UNFINISHED with the error cleared, and
    leaves every other record alone."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        failed = h.claim_one(h.items, 1)
        with h.transaction() as conn:
            assert h.dialect.fail(conn, h.items, 1, failed.token, ERROR)
        assert 1 not in h.claimable(h.items)

        with h.transaction() as conn:
            assert h.dialect.reset_failed(conn, h.items, 1) is True
        state = h.state(h.items, 1)
        assert state is not None
        assert state["execution_status"] is ExecutionStatus.UNFINISHED
        assert state["error"] is None, "reset_failed must clear the error"
        again = h.claim_one(h.items, 1)
        assert again.token > failed.token

        # Every other kind of record: FINISHED, WORKING, UNFINISHED, PENDING, none at all.
        finished = h.claim_one(h.items, 2)
        unfinished = h.claim_one(h.items, 4)
        with h.transaction() as conn:
            assert h.dialect.finish(conn, h.items, 2, finished.token)
            assert h.dialect.unfinish(conn, h.items, 4, unfinished.token, 1000)
        for source_id in (1, 2, 4, 5, 999):
            before = h.record(h.items, source_id)
            with h.transaction() as conn:
                reset = h.dialect.reset_failed(conn, h.items, source_id)
            assert reset is False, f"reset_failed reset non-failed record {source_id}"
            assert h.record(h.items, source_id) == before


# -- delays, retries and crashes ---------------------------------------------------------


def check_unfinish_delay(make_dialect: DialectFactory, url: str) -> None:
    """UNFINISHED with a delay is claimable only once the delay has passed."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        first = h.claim_one(h.items, 1)
        immediate = h.claim_one(h.items, 2)
        with h.transaction() as conn:
            assert h.dialect.unfinish(conn, h.items, 1, first.token, 60)
            assert h.dialect.unfinish(conn, h.items, 2, immediate.token, 0)
        state = h.state(h.items, 1)
        assert state is not None and state["execution_status"] is ExecutionStatus.UNFINISHED
        assert 2 in h.claimable(h.items), "UNFINISHED without a delay must be claimable at once"

        assert 1 not in h.claimable(h.items), "claimable before its delay"
        h.clock.advance(59.5)
        assert 1 not in h.claimable(h.items), "claimable before its delay"
        h.clock.advance(1)
        assert 1 in h.claimable(h.items), "not claimable after its delay"
        again = h.claim_one(h.items, 1)
        assert again.token > first.token


def check_fail_with_retry_delay(make_dialect: DialectFactory, url: str) -> None:
    """fail with a retry delay: UNFINISHED, failures counted, claimable after the delay."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        claim = h.claim_one(h.items, 1)
        for failures in (1, 2):
            with h.transaction() as conn:
                assert h.dialect.fail(conn, h.items, 1, claim.token, ERROR, retry_delay=30)
            state = h.state(h.items, 1)
            assert state is not None
            assert state["execution_status"] is ExecutionStatus.UNFINISHED
            record = h.record(h.items, 1)
            assert record is not None and record["failures"] == failures, (
                f"failures after {failures} retried failure(s): {record and record['failures']}"
            )
            assert 1 not in h.claimable(h.items), "claimable before the retry delay"
            h.clock.advance(29.5)
            assert 1 not in h.claimable(h.items), "claimable before the retry delay"
            h.clock.advance(1)
            retried = h.claim_one(h.items, 1)
            assert retried.token > claim.token
            assert retried.failures == failures, "the claim must report the failures so far"
            claim = retried

        with h.transaction() as conn:
            assert h.dialect.fail(conn, h.items, 1, claim.token, ERROR)
        state = h.state(h.items, 1)
        assert state is not None
        assert state["execution_status"] is ExecutionStatus.FAILED
        assert state["error"] == ERROR.message


def check_release_counts_crashes(make_dialect: DialectFactory, url: str) -> None:
    """A crash's release (as the failure policy decides it) counts a crash and fails the
    item at max_crashes; a stop's release gives the item back without counting."""
    max_crashes = 2
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        for crashes in (1, 2):
            claim = h.claim_one(h.items, 1)
            with h.transaction() as conn:
                crashed = decide(Ending.CRASHED, crashes=claim.crashes, max_crashes=max_crashes)
                assert h.dialect.record(conn, h.items, 1, claim.token, crashed, ERROR)
            record = h.record(h.items, 1)
            assert record is not None and record["crashes"] == crashes
        assert status_of(h, h.items, 1) == Phase.FAILED.value, "must end FAILED at max_crashes"
        state = h.state(h.items, 1)
        assert state is not None and state["error"] == ERROR.message
        h.clock.advance(10 * LEASE)
        assert 1 not in h.claimable(h.items)

        for _ in range(max_crashes + 1):
            claim = h.claim_one(h.items, 2)  # claimable again at once, no clock advance
            with h.transaction() as conn:
                assert h.dialect.record(conn, h.items, 2, claim.token, STOPPED, ERROR)
            record = h.record(h.items, 2)
            assert record is not None
            assert record["status"] == Phase.UNFINISHED.value
            assert record["crashes"] == 0, "a deliberate release must not count as a crash"


# -- reading -----------------------------------------------------------------------------


def _token_keys(value: object, path: str = "state") -> Iterable[str]:
    if isinstance(value, dict):
        for name, inner in value.items():
            where = f"{path}[{name!r}]"
            if "token" in str(name).lower():
                yield where
            yield from _token_keys(inner, where)
    elif isinstance(value, list | tuple):
        for index, inner in enumerate(value):
            yield from _token_keys(inner, f"{path}[{index}]")


def check_read_state(make_dialect: DialectFactory, url: str) -> None:
    """read_state: None before the first claim (pending included); the documented keys;
    never the token."""
    required = {"execution_status", "error", "lease_expires_at"}
    with Harness(make_dialect, url) as h:
        h.seed(items=())
        h.add_items(1, 2)
        assert h.state(h.items, 1) is None, "no record must read as None"
        h.discover(h.items)
        assert h.record(h.items, 1) is not None
        assert h.state(h.items, 1) is None, "a discovered, never claimed record reads as None"

        working = h.claim_one(h.items, 1)
        doomed = h.claim_one(h.items, 2)
        state = h.state(h.items, 1)
        assert state is not None and required <= set(state)
        assert state["execution_status"] is ExecutionStatus.WORKING
        assert state["error"] is None
        expires = state["lease_expires_at"]
        assert expires is not None and expires.tzinfo is not None, "expiry must be aware"
        assert abs((expires - utc(h.clock() + LEASE)).total_seconds()) < 1e-3
        assert list(_token_keys(state)) == [], "read_state exposes the token"

        with h.transaction() as conn:
            assert h.dialect.finish(conn, h.items, 1, working.token)
            assert h.dialect.fail(conn, h.items, 2, doomed.token, ERROR)
        for source_id, status, error in (
            (1, ExecutionStatus.FINISHED, None),
            (2, ExecutionStatus.FAILED, ERROR.message),
        ):
            state = h.state(h.items, source_id)
            assert state is not None and required <= set(state)
            assert state["execution_status"] is status
            assert state["error"] == error
            assert state["lease_expires_at"] is None
            assert list(_token_keys(state)) == [], "read_state exposes the token"


#: Every check by name; parametrized checks once per eligible-query variant.
