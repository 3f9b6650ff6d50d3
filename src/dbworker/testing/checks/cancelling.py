"""Conformance checks of cancellation: the CANCEL row from every open phase (an item
not discovered yet included), nothing from a terminal one, and a cancel racing a
holder's finish, where exactly one of them wins."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Connection

from ...core.status import Phase
from ..harness import LEASE, DialectFactory, Harness
from .common import status_of

#: The error type of a cancelled record.
CANCELLED_TYPE = "dbworker.Cancelled"
#: How long a racing transaction may wait for the other's row lock (the actors' own
#: lock timeout is a second: a wait is a finding elsewhere, here it is the point).
RACE_LOCK_TIMEOUT = 30.0


def _cancel(h: Harness, source_id: Any) -> bool:
    with h.transaction() as conn:
        return h.dialect.cancel(conn, h.items, source_id)


def _assert_cancelled(
    h: Harness, source_id: Any, token: int | None = None, at: float | None = None
) -> None:
    """The record of ``source_id`` as a cancel (at ``at``, default now) leaves it."""
    record = h.record(h.items, source_id)
    assert record is not None, f"cancelling item {source_id} left it without a record"
    assert record["status"] == Phase.FAILED.value, (
        f"a cancelled item {source_id} is {record['status']}, not failed"
    )
    assert record["error_type"] == CANCELLED_TYPE, f"error_type {record['error_type']!r}"
    assert "cancelled" in (record["error"] or ""), f"error {record['error']!r}"
    assert record["lease_expires_at"] is None and record["not_before"] is None
    assert record["finished_at"] == (h.clock() if at is None else at), (
        "a cancel sets finished_at to the time it ran"
    )
    if token is not None:
        assert record["token"] == token, "a cancel must not change the token (not a claim)"


def check_cancel_open_records(make_dialect: DialectFactory, url: str) -> None:
    """A pending, an unfinished, a working and a never discovered item are cancelled
    (FAILED, ``dbworker.Cancelled``) and never claimed, discovered or finished by their
    old holder until ``reset_failed``; a finished item, a cancelled one again and a key
    with no source row are left alone (False); a rolled-back cancel changes nothing."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        holder = h.actor()
        unfinished = h.claim_one(h.items, 2, holder)
        with h.transaction(holder) as conn:
            assert h.dialect.unfinish(conn, h.items, 2, unfinished.token, 0)
        working = h.claim_one(h.items, 3, holder)
        done = h.claim_one(h.items, 4, holder)
        with h.transaction(holder) as conn:
            assert h.dialect.finish(conn, h.items, 4, done.token)
        h.add_items(99)  # not discovered yet
        finished = h.record(h.items, 4)

        for source_id in (1, 2, 3, 99):
            assert _cancel(h, source_id) is True, f"cancelling open item {source_id} failed"
        _assert_cancelled(h, 1)
        _assert_cancelled(h, 2, unfinished.token)
        _assert_cancelled(h, 3, working.token)
        _assert_cancelled(h, 99)

        assert _cancel(h, 4) is False, "cancelling a finished item reported a change"
        assert h.record(h.items, 4) == finished, "cancelling a finished item changed it"
        again = h.record(h.items, 3)
        assert _cancel(h, 3) is False, "cancelling a cancelled item reported a change"
        assert h.record(h.items, 3) == again
        assert _cancel(h, 12345) is False, "cancelling a key with no source row reported a change"
        assert h.record(h.items, 12345) is None, "a key with no source row got a record"

        # In the caller's transaction: its rollback undoes the cancel.
        with holder.begin() as transaction:
            assert h.dialect.cancel(holder, h.items, 5)
            transaction.rollback()
        assert status_of(h, h.items, 5) == Phase.PENDING.value, "a rolled-back cancel stayed"

        # The scheduler's check of what it holds finds the cancelled claim (its token
        # unchanged), not a claim that moved on.
        with h.transaction(holder) as conn:
            found = h.dialect.cancelled(
                conn, h.items, [(3, working.token), (2, unfinished.token + 1), (5, 0)]
            )
        assert found == [3], f"the held items found cancelled: {found}, expected [3]"

        with h.transaction(holder) as conn:
            assert not h.dialect.finish(conn, h.items, 3, working.token), (
                "the old holder finished a cancelled item"
            )
        cancelled_at = h.clock()
        h.clock.advance(LEASE + 1)
        h.discover(h.items)
        h.sweep(h.items)
        claimable = h.claimable(h.items)
        assert not {1, 2, 3, 99} & set(claimable), f"cancelled items claimable: {claimable}"
        _assert_cancelled(h, 99, at=cancelled_at)

        for source_id in (1, 2, 3, 99):
            with h.transaction() as conn:
                assert h.dialect.reset_failed(conn, h.items, source_id)
        claimable = h.claimable(h.items)
        assert {1, 2, 3, 99} <= set(claimable), f"reset cancelled items not claimable: {claimable}"


def _race(
    h: Harness,
    first: Callable[[Connection], bool],
    second: Callable[[Connection], bool],
) -> tuple[bool, bool]:
    """Run ``first`` in an open transaction, start ``second`` in another thread and
    transaction, commit the first once the second is under way, then finish the second:
    both results. Its writes wait for the first's row (or, on SQLite, the write lock),
    or come after the commit: either way the first has won by then."""
    a, b = h.actor(RACE_LOCK_TIMEOUT), h.actor(RACE_LOCK_TIMEOUT)
    started = threading.Event()

    def run_second() -> bool:
        started.set()
        with b.begin():
            return second(b)

    with ThreadPoolExecutor(max_workers=1) as pool:
        with a.begin():
            won_first = first(a)
            running = pool.submit(run_second)
            assert started.wait(timeout=RACE_LOCK_TIMEOUT), "the second transaction never ran"
        won_second = running.result(timeout=RACE_LOCK_TIMEOUT * 2)
    return won_first, won_second


def check_cancel_racing_finish(make_dialect: DialectFactory, url: str) -> None:
    """A holder's finish and a cancel of the same item, each in a transaction held open
    while the other runs: exactly one of them wins, whichever commits first, and the
    record is what the winner wrote."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        one = h.claim_one(h.items, 1)
        two = h.claim_one(h.items, 2)

        # The finish holds its row while the cancel runs.
        finish = lambda c: h.dialect.finish(c, h.items, 1, one.token)  # noqa: E731
        won = _race(h, finish, lambda c: h.dialect.cancel(c, h.items, 1))
        assert won == (True, False), f"finish then cancel: (finish, cancel) won {won}"
        assert status_of(h, h.items, 1) == Phase.FINISHED.value

        # The cancel holds its row while the finish runs.
        cancel = lambda c: h.dialect.cancel(c, h.items, 2)  # noqa: E731
        won = _race(h, cancel, lambda c: h.dialect.finish(c, h.items, 2, two.token))
        assert won == (True, False), f"cancel then finish: (cancel, finish) won {won}"
        _assert_cancelled(h, 2, two.token)
