"""The conformance checks: plain functions ``check(make_dialect, url)``.

``make_dialect`` is called with a fake clock and must return the dialect under test;
``url`` names an empty database for it. A check raises AssertionError when the dialect
breaks the contract, and calls ``pytest.skip`` when a capability flag says the
behaviour does not apply. Assertions never ask which database this is: only the
dialect's declared capabilities select what is checked.

Claim cost independent of history is a benchmark (benchmarks/), not a check here.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from sqlalchemy import Connection, Select, event, select, update
from sqlalchemy.exc import DBAPIError

from dbworker import ExecutionStatus
from dbworker.core.policy import Ending, decide
from dbworker.core.status import Phase
from dbworker.dialects import Claim, Claims, WorkerTable

from .models import ITEMS, Group, Item, Keyed, key
from .support import (
    ERROR,
    FIRST_WORKER,
    KEYED_WORKER,
    LEASE,
    OWNER,
    SECOND_WORKER,
    VARIANTS,
    DialectFactory,
    Harness,
    by_id,
    ids,
    utc,
)

Check = Callable[[DialectFactory, str], None]
T = TypeVar("T")

ALL_ITEMS = [row.id for row in ITEMS]

#: How a stopping coordinator releases an item (not a crash).
STOPPED = decide(Ending.STOPPED)


def _without_waiting(what: str, call: Callable[[], T]) -> T:
    """Run ``call``; a lock wait (bounded by the actors' lock timeout) is a failure."""
    try:
        return call()
    except DBAPIError as exc:
        raise AssertionError(f"{what} waited for a lock or failed: {exc.orig!r}") from exc


def _skip_with_one_writer(h: Harness, what: str) -> None:
    if not h.dialect.supports_concurrent_claims:
        pytest.skip(
            "a database without concurrent claims has one writer at a time: every "
            f"application write waits for the {what}'s transaction, row locks or not"
        )


def _only(*source_ids: Any) -> Select[Any]:
    return select(Item).where(Item.id.in_(source_ids)).order_by(Item.id)


def _note(h: Harness, item_id: int) -> str | None:
    with h.app_engine.connect() as conn:
        return conn.execute(select(Item.note).where(Item.id == item_id)).scalar_one()


def _status(h: Harness, worker: WorkerTable, source_id: Any) -> str | None:
    record = h.record(worker, source_id)
    return None if record is None else record["status"]


# -- exclusivity -------------------------------------------------------------------------


def check_racing_claims(make_dialect: DialectFactory, url: str, variant: str = "ordered") -> None:
    """Two coordinators claiming at once split the work: never the same record twice,
    and the second gets the rows the first did not lock, not nothing."""
    chosen = VARIANTS[variant]
    expected = chosen.expected()
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        a = h.actor()
        if h.dialect.supports_concurrent_claims:
            b = h.actor()

            def second_claimer() -> list[Claim]:
                # B claims in its own transaction while A's claim is still uncommitted.
                with b.begin():
                    got = h.dialect.claim(b, h.items, chosen.query(), 2, LEASE, OWNER)
                    assert ids(got) == expected[3:5], (
                        f"while the first claimer holds {ids(won_a)}, a second claimer must "
                        f"get the next unlocked rows {expected[3:5]}, got {ids(got)}"
                    )
                    got += h.dialect.claim(b, h.items, chosen.query(), len(ITEMS), LEASE, OWNER)
                    assert ids(got) == expected[3:], (
                        f"a second claimer must get all the remaining rows {expected[3:]} "
                        f"while the first holds {ids(won_a)}, got {ids(got)}"
                    )
                    return got

            with a.begin():
                won_a = h.dialect.claim(a, h.items, chosen.query(), 3, LEASE, OWNER)
                assert ids(won_a) == expected[:3], "the first claimer must get the first rows"
                won_b = _without_waiting("a second claimer", second_claimer)
        else:
            b = h.actor(lock_timeout=0.2)
            with a.begin():
                won_a = h.dialect.claim(a, h.items, chosen.query(), 3, LEASE, OWNER)
                assert ids(won_a) == expected[:3], "the first claimer must get the first rows"
                # One writer at a time: the second claimer must wait for the first
                # transaction (here: time out waiting), never claim beside it.
                try:
                    sneaked = h.claim(b, h.items, chosen.query(), len(ITEMS))
                except DBAPIError as exc:
                    assert h.dialect.is_transient(exc), (
                        f"waiting for the write lock must surface as a transient error: {exc!r}"
                    )
                else:
                    raise AssertionError(
                        "without concurrent claims a second claimer must wait for the first "
                        f"claim's transaction, but it claimed {ids(sneaked)} beside it"
                    )
            won_b = h.claim(b, h.items, chosen.query(), len(ITEMS))
            assert ids(won_b) == expected[3:], (
                f"after the first claim committed, a second claimer must get the remaining "
                f"rows {expected[3:]}, got {ids(won_b)}"
            )

        everyone = won_a + won_b
        assert len(set(ids(everyone))) == len(everyone), f"a record was claimed twice: {everyone}"
        records = h.records(h.items)
        for claim in everyone:
            record = records[claim.source_id]
            assert record["status"] == Phase.WORKING.value
            assert record["token"] == claim.token, "the claimer's token must be the current one"
            assert record["attempts"] == claim.attempts == 1
            assert record["lease_expires_at"] == h.clock() + LEASE
        for source_id in set(ALL_ITEMS) - set(expected):
            assert records[source_id]["status"] == Phase.PENDING.value, (
                f"ineligible row {source_id} must not be claimed"
            )
        third = h.claim(h.actor(), h.items, chosen.query(), len(ITEMS))
        assert third == [], f"every eligible row is leased, yet a third claimer got {ids(third)}"


def check_claim_leaves_source_rows_unlocked(
    make_dialect: DialectFactory, url: str, variant: str = "join"
) -> None:
    """While a claim's transaction is open, the application can update the claimed rows
    (and the rows the eligible query joined) without waiting."""
    chosen = VARIANTS[variant]
    with Harness(make_dialect, url) as h:
        _skip_with_one_writer(h, "claim")
        h.seed()
        h.discover(h.items)
        a, app = h.actor(), h.app()
        with a.begin():
            won = h.dialect.claim(a, h.items, chosen.query(), 3, LEASE, OWNER)
            assert ids(won) == chosen.expected()[:3]
            groups = {row.group_id for row in ITEMS if row.id in ids(won)}

            def touch() -> None:
                with app.begin():
                    app.execute(update(Item).where(Item.id.in_(ids(won))).values(note="app"))
                    app.execute(update(Group).where(Group.id.in_(groups)).values(label="app"))

            _without_waiting("an application UPDATE of claimed rows during a claim", touch)
        assert [_note(h, i) for i in ids(won)] == ["app"] * len(won)
        assert all(_status(h, h.items, i) == Phase.WORKING.value for i in ids(won))


def check_concurrent_discovery_hides_no_claimable_record(
    make_dialect: DialectFactory, url: str
) -> None:
    """Two coordinators woken by one commit discover the same new rows at once, and the
    second one's insert of keys the first added may lock those records until it
    commits. A claim meanwhile must not wait, and must take each claimable record or
    report it skipped (``Claims.skipped``): a record passed over in silence waits for
    its coordinator's next poll, which may be a minute away."""
    with Harness(make_dialect, url) as h:
        _skip_with_one_writer(h, "discovery")
        h.seed()
        first, second = h.actor(), h.actor()
        inserting, discovered, done = threading.Event(), threading.Event(), threading.Event()

        @event.listens_for(second, "before_cursor_execute")
        def _inserting(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if "INSERT" in statement.upper():  # alone, or in a CTE
                inserting.set()

        def second_discovery() -> None:
            with second.begin():
                h.dialect.discover(second, h.items)
                discovered.set()
                done.wait(timeout=30)

        with ThreadPoolExecutor(max_workers=1) as pool:
            try:
                with first.begin():
                    h.dialect.discover(first, h.items)
                    running = pool.submit(second_discovery)
                    # The second read the watermark before the first committed: it
                    # inserts every key again, waiting for the first's locks, then
                    # holding its own.
                    assert inserting.wait(timeout=30), "the second discovery never inserted"
                assert discovered.wait(timeout=30), "the second discovery never finished"
                claims = _without_waiting(
                    "a claim beside a discovery",
                    lambda: h.claim(h.actor(), h.items, by_id(), len(ITEMS)),
                )
            finally:
                done.set()
            running.result()
        skipped = claims.skipped if isinstance(claims, Claims) else 0
        assert len(claims) + skipped >= len(ITEMS), (
            f"of {len(ITEMS)} claimable records a claim took {ids(claims)} and reported "
            f"{skipped} skipped: the rest were passed over without a word"
        )
        rest = h.claim(h.actor(), h.items, by_id(), len(ITEMS))
        assert sorted(ids(claims) + ids(rest)) == ALL_ITEMS


# -- fencing -----------------------------------------------------------------------------


def _taken_over(h: Harness, a: Connection, b: Connection) -> tuple[Claim, Claim]:
    """A claims item 1, its lease expires, B takes it over."""
    old = h.claim_one(h.items, 1, a)
    h.clock.advance(LEASE + 1)
    new = h.claim_one(h.items, 1, b)
    return old, new


def check_takeover_after_lease_expiry(make_dialect: DialectFactory, url: str) -> None:
    """An expired lease can be taken over: a new, larger token; the old holder can no
    longer change anything; the takeover counts as a crash."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        a, b = h.actor(), h.actor()
        old = h.claim_one(h.items, 1, a)
        h.clock.advance(LEASE / 2)
        assert 1 not in h.claimable(h.items), "claimable while its lease is still running"
        h.clock.advance(LEASE / 2 + 1)
        new = h.claim_one(h.items, 1, b)
        assert new.token > old.token, f"takeover token {new.token} not above {old.token}"

        record = h.record(h.items, 1)
        assert record is not None
        assert record["status"] == Phase.WORKING.value
        assert record["token"] == new.token
        assert record["lease_expires_at"] == h.clock() + LEASE
        assert record["crashes"] == 1, "the takeover must count as a crash of the old holder"
        assert (new.attempts, new.crashes) == (record["attempts"], record["crashes"]) == (2, 1), (
            f"the claim must report the record's counters after the takeover: {new}"
        )

        stale: dict[str, Callable[[Connection], object]] = {
            "finish": lambda c: h.dialect.finish(c, h.items, 1, old.token),
            "unfinish": lambda c: h.dialect.unfinish(c, h.items, 1, old.token, 0),
            "fail": lambda c: h.dialect.fail(c, h.items, 1, old.token, ERROR),
            "fail with retry": lambda c: h.dialect.fail(
                c, h.items, 1, old.token, ERROR, retry_delay=0
            ),
            "release": lambda c: h.dialect.release(c, h.items, 1, old.token, ERROR, gives_up=True),
            "release (not a crash)": lambda c: h.dialect.release(
                c, h.items, 1, old.token, ERROR, gives_up=False, counts_crash=False
            ),
            "renew": lambda c: h.dialect.renew(c, h.items, [(1, old.token)], LEASE) == [],
        }
        h.clock.advance(1)
        for name, attempt in stale.items():
            # Committed, not rolled back: a change would stay visible.
            with a.begin():
                result = attempt(a)
            assert result is False, f"{name} with the stale token reported success"
            assert h.record(h.items, 1) == record, f"{name} with the stale token changed the record"
        with b.begin():
            assert h.dialect.finish(b, h.items, 1, new.token), "the current holder must finish"
        assert _status(h, h.items, 1) == Phase.FINISHED.value


def check_stale_token_cannot_complete_or_renew(make_dialect: DialectFactory, url: str) -> None:
    """Renewal and completion are fenced: the stale token fails, the current one works."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        a, b = h.actor(), h.actor()
        old, new = _taken_over(h, a, b)
        before = h.record(h.items, 1)
        h.clock.advance(5)

        with a.begin():
            lost = h.dialect.renew(a, h.items, [(1, old.token)], LEASE)
        assert lost == [1], "renewing with a stale token must report the claim as lost"
        assert h.record(h.items, 1) == before, "a stale renewal changed the record"

        with b.begin():
            lost = h.dialect.renew(b, h.items, [(1, new.token)], LEASE)
        assert lost == [], "renewing with the current token must succeed"
        renewed = h.record(h.items, 1)
        assert renewed is not None
        assert renewed["lease_expires_at"] == h.clock() + LEASE, "renewal must extend the lease"
        assert renewed["token"] == new.token, "renewal must not change the token"

        with a.begin():
            assert not h.dialect.finish(a, h.items, 1, old.token), "stale finish succeeded"
        assert h.record(h.items, 1) == renewed, "a stale finish changed the record"
        with b.begin():
            assert h.dialect.finish(b, h.items, 1, new.token), "current finish failed"
        assert _status(h, h.items, 1) == Phase.FINISHED.value


def check_completion_is_atomic(make_dialect: DialectFactory, url: str) -> None:
    """Completion runs in the caller's transaction: the caller's own writes commit if and
    only if the fenced transition does."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        a, b = h.actor(), h.actor()
        old, new = _taken_over(h, a, b)
        before = h.record(h.items, 1)

        def complete(conn: Connection, token: int, note: str) -> bool:
            # What the child runtime does: the handler's writes, then the transition,
            # committed together, or rolled back together when the claim was lost.
            with conn.begin() as transaction:
                conn.execute(update(Item).where(Item.id == 1).values(note=note))
                done = h.dialect.finish(conn, h.items, 1, token)
                if not done:
                    transaction.rollback()
            return done

        assert complete(a, old.token, "stale") is False, "a stale holder completed"
        assert _note(h, 1) is None, "a stale holder's write committed"
        assert h.record(h.items, 1) == before

        # The transition must belong to the caller's transaction: rolling that back
        # (a later error in the handler's commit path) undoes the transition too.
        with b.begin() as transaction:
            b.execute(update(Item).where(Item.id == 1).values(note="rolled back"))
            assert h.dialect.finish(b, h.items, 1, new.token)
            transaction.rollback()
        assert _note(h, 1) is None
        assert h.record(h.items, 1) == before, (
            "finish must run in the caller's transaction: it survived that transaction's rollback"
        )

        assert complete(b, new.token, "current") is True
        assert _note(h, 1) == "current"
        assert _status(h, h.items, 1) == Phase.FINISHED.value


# -- terminal states and their way back ----------------------------------------------------


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
        assert _status(h, h.items, 1) == Phase.FAILED.value, "must end FAILED at max_crashes"
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


# -- eligibility -------------------------------------------------------------------------


def check_status_condition_gates_dependent_claims(make_dialect: DialectFactory, url: str) -> None:
    """A worker whose eligible query requires another worker's FINISHED only claims
    rows the other worker finished."""
    with Harness(make_dialect, url, workers=(FIRST_WORKER, SECOND_WORKER)) as h:
        h.seed()
        h.discover(h.first)
        h.discover(h.second)

        def condition(*statuses: ExecutionStatus) -> Any:
            return h.dialect.status_condition(h.first, Item.id, statuses)

        def dependent() -> Select[Any]:
            return select(Item).where(condition(ExecutionStatus.FINISHED)).order_by(Item.id)

        claims = {i: h.claim_one(h.first, i) for i in (1, 2, 3, 4)}
        with h.transaction() as conn:
            assert h.dialect.finish(conn, h.first, 1, claims[1].token)
            assert h.dialect.fail(conn, h.first, 2, claims[2].token, ERROR)
            assert h.dialect.unfinish(conn, h.first, 3, claims[3].token, 0)
        # 4 stays WORKING, 5.. PENDING (discovered, never claimed).

        def matching(*statuses: ExecutionStatus) -> list[int]:
            query = select(Item.id).where(condition(*statuses)).order_by(Item.id)
            with h.app_engine.connect() as conn:
                return list(conn.execute(query).scalars())

        assert matching(ExecutionStatus.FINISHED) == [1], "only row 1 is FINISHED"
        assert matching(ExecutionStatus.FAILED, ExecutionStatus.WORKING) == [2, 4]
        assert matching(*ExecutionStatus) == [1, 2, 3, 4], "never-claimed rows have no status"

        a = h.actor()
        assert ids(h.claim(a, h.second, dependent(), len(ITEMS))) == [1]
        assert h.claim(a, h.second, dependent(), len(ITEMS)) == []
        again = h.claim_one(h.first, 3)
        with h.transaction() as conn:
            assert h.dialect.finish(conn, h.first, 3, again.token)
        assert ids(h.claim(a, h.second, dependent(), len(ITEMS))) == [3]


def check_batch_claims_follow_eligible_order(make_dialect: DialectFactory, url: str) -> None:
    """claim(limit=n) returns up to n distinct records, in the eligible query's order."""
    chosen = VARIANTS["ordered"]
    order = chosen.expected()
    assert order != sorted(order), "the fixture must order differently from the keys"
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        a = h.actor()
        before = h.records(h.items)
        assert h.claim(a, h.items, chosen.query(), 0) == []
        assert h.records(h.items) == before, "claim(limit=0) changed records"
        batches = [h.claim(a, h.items, chosen.query(), n) for n in (3, 3, 5, 3)]
        got = [ids(batch) for batch in batches]
        assert got == [order[:3], order[3:6], order[6:], []], (
            f"batches of 3, 3, 5, 3 must follow the eligible order {order}: got {got}"
        )
        tokens = {c.source_id: c.token for batch in batches for c in batch}
        records = h.records(h.items)
        assert all(records[i]["token"] == t for i, t in tokens.items())


# -- discovery ---------------------------------------------------------------------------


def _known(h: Harness, worker: WorkerTable) -> set[Any]:
    return set(h.records(worker))


def check_discovers_later_inserts(make_dialect: DialectFactory, url: str) -> None:
    """Rows inserted after a discovery round are found by the next one."""
    with Harness(make_dialect, url) as h:
        h.seed(items=())
        h.add_items(1, 2, 3)
        h.discover(h.items)
        assert _known(h, h.items) == {1, 2, 3}
        h.add_items(4, 5)
        h.discover(h.items)
        assert _known(h, h.items) == {1, 2, 3, 4, 5}, "rows inserted later were not discovered"
        assert ids(h.claim(h.actor(), h.items, by_id(), 10)) == [1, 2, 3, 4, 5]


def check_discovery_reports_its_watermark(make_dialect: DialectFactory, url: str) -> None:
    """``discover_to_watermark`` adds what ``discover`` adds and returns the largest
    key known after it (what the coordinator's later sweeps start from)."""
    with Harness(make_dialect, url) as h:
        h.seed(items=())

        def discover() -> tuple[int, Any]:
            with h.admin.begin():
                return h.dialect.discover_to_watermark(h.admin, h.items)

        assert discover() == (0, None)
        h.add_items(1, 2, 3)
        assert discover() == (3, 3)
        assert discover() == (0, 3)
        h.add_items(7)
        assert discover() == (1, 7), "the watermark must follow the keys discovery added"
        assert _known(h, h.items) == {1, 2, 3, 7}


def check_discovery_leaves_source_rows_unlocked(make_dialect: DialectFactory, url: str) -> None:
    """While a discovery's transaction is open, the application can update the rows it
    found and insert rows above them without waiting."""
    with Harness(make_dialect, url) as h:
        _skip_with_one_writer(h, "discovery")
        h.seed()
        a, app = h.actor(), h.app()
        newest = max(row.id for row in ITEMS)
        with a.begin():
            assert h.dialect.discover(a, h.items) == len(ITEMS)

            def touch() -> None:
                with app.begin():
                    app.execute(update(Item).values(note="app"))
                    h.add_items(newest + 1, conn=app)

            _without_waiting("an application write of discovered rows during a discovery", touch)
        assert [_note(h, row.id) for row in ITEMS] == ["app"] * len(ITEMS)
        assert _known(h, h.items) == {row.id for row in ITEMS}


def check_sweep_finds_rows_below_watermark(make_dialect: DialectFactory, url: str) -> None:
    """Rows whose keys sit below ones already discovered are found by ``sweep``.

    ``discover`` alone may miss them (it is allowed to look only above the largest
    known key), so nothing is asserted about it.
    """
    with Harness(make_dialect, url) as h:
        h.seed(items=())
        h.add_items(1, 2, 10)
        h.discover(h.items)
        h.add_items(5)
        h.discover(h.items)  # may or may not see 5
        h.sweep(h.items)
        assert _known(h, h.items) == {1, 2, 5, 10}, "sweep missed a row below the watermark"
        h.add_items(4, 7)
        h.sweep(h.items, above=5)
        assert 7 in _known(h, h.items), "sweep(above=5) must find key 7"
        h.sweep(h.items)
        assert _known(h, h.items) == {1, 2, 4, 5, 7, 10}
        assert ids(h.claim(h.actor(), h.items, by_id(), 10)) == [1, 2, 4, 5, 7, 10]


def check_out_of_order_commits_found_by_sweep(make_dialect: DialectFactory, url: str) -> None:
    """An insert that commits after a larger key was discovered is found by ``sweep``.

    ``discover`` alone may miss it: by the time key 5 is visible, the watermark is
    already 6. That is allowed, so nothing is asserted about it.
    """
    with Harness(make_dialect, url) as h:
        if not h.dialect.supports_concurrent_claims:
            pytest.skip(
                "a database without concurrent claims has one writer at a time, so inserts "
                "commit in the order they are made (check_sweep_finds_rows_below_watermark "
                "covers keys below the watermark)"
            )
        h.seed(items=())
        h.add_items(1, 2, 3, 4)
        h.discover(h.items)
        late, early = h.app(), h.app()
        with late.begin():
            h.add_items(5, conn=late)
            with early.begin():
                h.add_items(6, conn=early)
            _without_waiting("discovery beside an open insert", lambda: h.discover(h.items))
            assert 6 in _known(h, h.items)
        h.discover(h.items)  # may or may not see 5
        h.sweep(h.items)
        assert _known(h, h.items) == {1, 2, 3, 4, 5, 6}, "sweep missed the late commit"
        assert ids(h.claim(h.actor(), h.items, by_id(), 10)) == [1, 2, 3, 4, 5, 6]


def check_non_integer_keys_discovered(make_dialect: DialectFactory, url: str) -> None:
    """Sources with non-integer keys (UUID strings) are discovered and claimable."""
    with Harness(make_dialect, url, workers=(KEYED_WORKER,)) as h:
        h.seed(items=())
        first = [key(f"first-{i}") for i in range(3)]
        h.add_keyed(*first)
        h.discover(h.keyed)
        assert _known(h, h.keyed) == set(first)
        later = [key(f"later-{i}") for i in range(3)]
        # Random keys do not grow with inserts: some later key sorts below an earlier one,
        # which a watermark (largest known key) would never find.
        assert min(later) < max(first)
        h.add_keyed(*later)
        h.discover(h.keyed)
        everything = sorted(first + later)
        assert _known(h, h.keyed) == set(everything), "non-integer keys inserted later missed"
        query = select(Keyed).order_by(Keyed.id)
        claims = h.claim(h.actor(), h.keyed, query, 10)
        assert ids(claims) == everything
        with h.transaction() as conn:
            assert h.dialect.finish(conn, h.keyed, claims[0].source_id, claims[0].token)
        assert _status(h, h.keyed, claims[0].source_id) == Phase.FINISHED.value


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
CHECKS: dict[str, Check] = {
    **{
        f"racing_claims[{name}]": functools.partial(check_racing_claims, variant=name)
        for name in VARIANTS
    },
    **{
        f"claim_leaves_source_rows_unlocked[{name}]": functools.partial(
            check_claim_leaves_source_rows_unlocked, variant=name
        )
        for name in VARIANTS
    },
    "concurrent_discovery_hides_no_claimable_record": (
        check_concurrent_discovery_hides_no_claimable_record
    ),
    "takeover_after_lease_expiry": check_takeover_after_lease_expiry,
    "stale_token_cannot_complete_or_renew": check_stale_token_cannot_complete_or_renew,
    "completion_is_atomic": check_completion_is_atomic,
    "terminal_records_never_claimed": check_terminal_records_never_claimed,
    "reset_failed": check_reset_failed,
    "unfinish_delay": check_unfinish_delay,
    "fail_with_retry_delay": check_fail_with_retry_delay,
    "release_counts_crashes": check_release_counts_crashes,
    "status_condition_gates_dependent_claims": check_status_condition_gates_dependent_claims,
    "batch_claims_follow_eligible_order": check_batch_claims_follow_eligible_order,
    "discovers_later_inserts": check_discovers_later_inserts,
    "discovery_reports_its_watermark": check_discovery_reports_its_watermark,
    "discovery_leaves_source_rows_unlocked": check_discovery_leaves_source_rows_unlocked,
    "sweep_finds_rows_below_watermark": check_sweep_finds_rows_below_watermark,
    "out_of_order_commits_found_by_sweep": check_out_of_order_commits_found_by_sweep,
    "non_integer_keys_discovered": check_non_integer_keys_discovered,
    "read_state": check_read_state,
}
