"""Conformance checks of claims: exclusive between racing claimers, free of the
application's rows, blind to no claimable record, in the eligible query's order and
gated by other workers' statuses."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Select, event, select, update
from sqlalchemy.exc import DBAPIError

from ...core.status import ExecutionStatus, Phase
from ...dialects import Claim, Claims
from ..harness import ERROR, LEASE, OWNER, DialectFactory, Harness, ids
from ..models import FIRST_WORKER, ITEMS, SECOND_WORKER, VARIANTS, Group, Item, by_id
from .common import ALL_ITEMS, note_of, skip_with_one_writer, status_of, without_waiting


def check_racing_claims(
    make_dialect: DialectFactory, url: str, variant: str = "ordered", scheduler: bool = False
) -> None:
    """Two coordinators claiming at once split the work: never the same record twice,
    and the second gets the rows the first did not lock, not nothing. ``scheduler``: on
    connections set up as a scheduler keeps its own (``Dialect.scheduler_connection``)."""
    chosen = VARIANTS[variant]
    expected = chosen.expected()
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        actor = h.scheduler if scheduler else h.actor
        a = actor()
        if h.dialect.supports_concurrent_claims:
            b = actor()

            def second_claimer() -> list[Claim]:
                # B claims in its own transaction while A's is still open (on a
                # scheduler's connection A's claim committed by itself).
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
                won_b = without_waiting("a second claimer", second_claimer)
        else:
            b = actor(lock_timeout=0.2)
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
        skip_with_one_writer(h, "claim")
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

            without_waiting("an application UPDATE of claimed rows during a claim", touch)
        assert [note_of(h, i) for i in ids(won)] == ["app"] * len(won)
        assert all(status_of(h, h.items, i) == Phase.WORKING.value for i in ids(won))


def check_concurrent_discovery_hides_no_claimable_record(
    make_dialect: DialectFactory, url: str
) -> None:
    """Two coordinators woken by one commit discover the same new rows at once, and the
    second one's insert of keys the first added may lock those records until it
    commits. A claim meanwhile must not wait, and must take each claimable record or
    report it skipped (``Claims.skipped``): a record passed over in silence waits for
    its coordinator's next poll, which may be a minute away."""
    with Harness(make_dialect, url) as h:
        skip_with_one_writer(h, "discovery")
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
                claims = without_waiting(
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
