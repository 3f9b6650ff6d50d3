"""Conformance checks of per-key limits (issue 26): ``exclusive_by`` claims one record
per key and none of a key held, across racing claimers, and frees a key with every
ending; ``rate_limit`` claims no more than its slots allow in a window, per key too."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, select

from ...core.status import Phase
from ..harness import ERROR, LEASE, OWNER, DialectFactory, Harness, ids
from ..models import EXCLUSIVE_WORKER, RATE, RATED_BY_WORKER, RATED_WORKER, Item, by_id
from .common import skip_with_one_writer

#: The conformance items by group (models.ITEMS): the exclusive worker's keys.
GROUP_1 = [1, 3, 6, 10, 11]


def _held(h: Harness) -> dict[Any, tuple[str, str | None]]:
    """Each record's (status, held_key)."""
    worker = h.workers[EXCLUSIVE_WORKER]
    return {sid: (r["status"], r["held_key"]) for sid, r in h.records(worker).items()}


def _assert_one_holder_per_key(h: Harness) -> None:
    held = _held(h)
    working = {sid: key for sid, (status, key) in held.items() if status == Phase.WORKING.value}
    assert all(key is not None for key in working.values()), (
        f"every WORKING record of an exclusive worker holds its key: {held}"
    )
    assert len(set(working.values())) == len(working), f"two WORKING records share a key: {held}"
    ended = {sid: key for sid, (status, key) in held.items() if status != Phase.WORKING.value}
    assert all(key is None for key in ended.values()), f"a record not WORKING holds a key: {held}"


def check_exclusive_claims_one_per_key(make_dialect: DialectFactory, url: str) -> None:
    """One record per key per claim, none of a key held (expired or not: the expired
    holder is taken over as itself), and an ending frees its key."""
    with Harness(make_dialect, url, workers=(EXCLUSIVE_WORKER,)) as h:
        worker = h.workers[EXCLUSIVE_WORKER]
        h.seed()
        h.discover(worker)
        first = h.claim(h.admin, worker, by_id(), 12)
        assert ids(first) == [1, 2, 4], f"one item per group, in order: got {ids(first)}"
        _assert_one_holder_per_key(h)
        assert ids(h.claim(h.admin, worker, by_id(), 12)) == [], "every key is held"
        with h.transaction() as conn:
            assert h.dialect.finish(conn, worker, 1, first[0].token)
        _assert_one_holder_per_key(h)
        again = h.claim(h.admin, worker, by_id(), 12)
        assert ids(again) == [3], f"a finish frees its key for the next item: got {ids(again)}"
        h.clock.advance(LEASE + 1)
        taken = h.claim(h.admin, worker, by_id(), 12)
        assert ids(taken) == [2, 3, 4], (
            f"expired holders are taken over as themselves, keeping their keys: got {ids(taken)}"
        )
        _assert_one_holder_per_key(h)
        with h.transaction() as conn:
            assert h.dialect.fail(conn, worker, 3, taken[1].token, ERROR)
        assert ids(h.claim(h.admin, worker, by_id(), 12)) == [6], "a failure frees its key"
        _assert_one_holder_per_key(h)


def check_racing_claims_of_one_key(make_dialect: DialectFactory, url: str) -> None:
    """Two claimers that pick different items of one free key at once: the database
    lets one of them have it; the other claims its other keys, without an error."""
    with Harness(make_dialect, url, workers=(EXCLUSIVE_WORKER,)) as h:
        skip_with_one_writer(h, "claim")
        worker = h.workers[EXCLUSIVE_WORKER]
        h.seed()
        h.discover(worker)
        a, b = h.actor(), h.actor()
        table_name = worker.table.name
        a_tx = a.begin()
        assert ids(h.dialect.claim(a, worker, by_id(), 1, LEASE, OWNER)) == [1]

        def commit_a_first(
            conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
        ) -> None:
            # B searched while A's claim was uncommitted (item 3 of A's group looked
            # free); A commits just before B writes its claim (a claim whose search and
            # UPDATE are one statement, a CTE's, sees A's claim committed).
            if a_tx.is_active and f"UPDATE {table_name} " in statement:
                a_tx.commit()

        event.listen(b, "before_cursor_execute", commit_a_first)
        try:
            with b.begin():
                others = select(Item).where(Item.id != 1).order_by(Item.id)
                got = h.dialect.claim(b, worker, others, 12, LEASE, OWNER)
        finally:
            event.remove(b, "before_cursor_execute", commit_a_first)
        assert not a_tx.is_active, "the second claim never wrote its claim"
        assert ids(got) == [2, 4], (
            f"the second claimer gets the keys nobody holds (groups 2 and 3), got {ids(got)}"
        )
        _assert_one_holder_per_key(h)


def check_rate_limit_in_window(make_dialect: DialectFactory, url: str) -> None:
    """At most RATE.count claims in any window, however many claims ask; a rolled
    back claim gives its slots back; racing claimers share the slots."""
    with Harness(make_dialect, url, workers=(RATED_WORKER,)) as h:
        worker = h.workers[RATED_WORKER]
        h.seed()
        h.discover(worker)
        with h.admin.begin() as tx:
            assert len(h.dialect.claim(h.admin, worker, by_id(), 12, LEASE, OWNER)) == RATE.count
            tx.rollback()
        got = h.claim(h.admin, worker, by_id(), 2)
        assert ids(got) == [1, 2], f"a rolled back claim used no slot: got {ids(got)}"
        if h.dialect.supports_concurrent_claims:
            b = h.actor()
            with h.admin.begin():
                mine = h.dialect.claim(h.admin, worker, by_id(), 12, LEASE, OWNER)
                assert ids(mine) == [3]
                with b.begin():
                    theirs = h.dialect.claim(b, worker, by_id(), 12, LEASE, OWNER)
                assert ids(theirs) == [], f"no slot is left in this window: got {ids(theirs)}"
        else:
            assert ids(h.claim(h.admin, worker, by_id(), 12)) == [3]
        h.clock.advance(RATE.seconds / 2)
        assert ids(h.claim(h.admin, worker, by_id(), 12)) == [], "still in the same window"
        h.clock.advance(RATE.seconds / 2)
        later = h.claim(h.admin, worker, by_id(), 12)
        assert ids(later) == [4, 5, 6], f"a window later the slots are free: got {ids(later)}"


def check_rate_limit_per_key(make_dialect: DialectFactory, url: str) -> None:
    """``rate_limit_by``: RATE.count claims per key value in a window."""
    with Harness(make_dialect, url, workers=(RATED_BY_WORKER,)) as h:
        worker = h.workers[RATED_BY_WORKER]
        h.seed()
        h.discover(worker)
        # A claim within every key's slots, then one past them (their slots are made as
        # claims need them): each key's claims stop at RATE.count.
        first = h.claim(h.admin, worker, by_id(), 2)
        assert ids(first) == [1, 2], f"a claim within the rate: got {ids(first)}"
        got = h.claim(h.admin, worker, by_id(), 12)
        assert ids(got) == [3, 4, 5, 6, 7, 8, 9], f"three per group: got {ids(got)}"
        assert ids(h.claim(h.admin, worker, by_id(), 12)) == []
        h.clock.advance(RATE.seconds)
        assert ids(h.claim(h.admin, worker, by_id(), 12)) == [10, 11, 12]
