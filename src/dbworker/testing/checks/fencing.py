"""Conformance checks of fencing: a takeover after the lease runs out, and a stale
token that can neither complete nor renew; completion in the caller's transaction."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, update

from ...core.status import Phase
from ...dialects import Claim
from ..harness import ERROR, LEASE, DialectFactory, Harness
from ..models import Item
from ..report import NotApplicable
from .common import note_of, status_of


def _taken_over(h: Harness) -> tuple[Connection, Connection, Claim, Claim]:
    """Seeded and discovered: actor A claims item 1, its lease expires, B takes it over."""
    h.seed()
    h.discover(h.items)
    a, b = h.actor(), h.actor()
    old = h.claim_one(h.items, 1, a)
    h.clock.advance(LEASE + 1)
    new = h.claim_one(h.items, 1, b)
    return a, b, old, new


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
        assert status_of(h, h.items, 1) == Phase.FINISHED.value


def check_stale_token_cannot_complete_or_renew(make_dialect: DialectFactory, url: str) -> None:
    """Renewal and completion are fenced: the stale token fails, the current one works."""
    with Harness(make_dialect, url) as h:
        a, b, old, new = _taken_over(h)
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
        assert status_of(h, h.items, 1) == Phase.FINISHED.value


def check_completion_is_atomic(make_dialect: DialectFactory, url: str) -> None:
    """Completion runs in the caller's transaction: the caller's own writes commit if and
    only if the fenced transition does."""
    with Harness(make_dialect, url) as h:
        a, b, old, new = _taken_over(h)
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
        assert note_of(h, 1) is None, "a stale holder's write committed"
        assert h.record(h.items, 1) == before

        # The transition must belong to the caller's transaction: rolling that back
        # (a later error in the handler's commit path) undoes the transition too.
        with b.begin() as transaction:
            b.execute(update(Item).where(Item.id == 1).values(note="rolled back"))
            assert h.dialect.finish(b, h.items, 1, new.token)
            transaction.rollback()
        assert note_of(h, 1) is None
        assert h.record(h.items, 1) == before, (
            "finish must run in the caller's transaction: it survived that transaction's rollback"
        )

        assert complete(b, new.token, "current") is True
        assert note_of(h, 1) == "current"
        assert status_of(h, h.items, 1) == Phase.FINISHED.value


def check_finish_all_matches_current_tokens(make_dialect: DialectFactory, url: str) -> None:
    """A group's FINISH in one statement (``finish_all``) finishes the pairs whose token
    is current and counts them, whatever the count of pairs, and nothing else."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        a, b = h.actor(), h.actor()
        held = {source_id: h.claim_one(h.items, source_id, a).token for source_id in (1, 2, 3)}
        h.clock.advance(LEASE + 1)
        taken = h.claim_one(h.items, 2, b)
        before = h.record(h.items, 2)
        with a.begin():
            matched = h.dialect.finish_all(a, h.items, sorted(held.items()))
        assert matched == 2, f"two pairs were current, finish_all matched {matched}"
        assert [status_of(h, h.items, i) for i in (1, 3)] == [Phase.FINISHED.value] * 2
        assert h.record(h.items, 2) == before, "the pair with a stale token changed its record"
        claims = [taken] + [h.claim_one(h.items, source_id, b) for source_id in (4, 5, 6, 7)]
        with b.begin():
            matched = h.dialect.finish_all(b, h.items, [(c.source_id, c.token) for c in claims])
        assert matched == 5, f"five pairs were current, finish_all matched {matched}"
        assert all(status_of(h, h.items, c.source_id) == Phase.FINISHED.value for c in claims)


def check_autocommitted_finish_commits_alone(make_dialect: DialectFactory, url: str) -> None:
    """Where the dialect sends statements as transactions of their own
    (``autocommitting`` yields True), a FINISH of all sent so commits by itself,
    before its SQLAlchemy transaction ends, names exactly the pairs whose token was
    current, and leaves the connection as it was: its next statements begin a
    transaction again, which a rollback undoes."""
    with Harness(make_dialect, url) as h:
        h.seed()
        h.discover(h.items)
        a, b = h.actor(), h.actor()
        with h.dialect.autocommitting(a) as alone:
            pass
        if not alone:
            raise NotApplicable("the dialect sends no statement as a transaction of its own")
        held = {source_id: h.claim_one(h.items, source_id, a).token for source_id in (1, 2, 3)}
        h.clock.advance(LEASE + 1)
        taken = h.claim_one(h.items, 2, b)
        before = h.record(h.items, 2)
        with a.begin() as transaction:
            with h.dialect.autocommitting(a) as alone:
                assert alone, "a connection holding no transaction did not autocommit"
                matched = h.dialect.finish_all_returning(a, h.items, sorted(held.items()))
            assert matched == {1, 3}, f"pairs 1 and 3 were current, the FINISH named {matched}"
            # Seen from elsewhere while the transaction it ran in is still open.
            assert [status_of(h, h.items, i) for i in (1, 3)] == [Phase.FINISHED.value] * 2
            assert h.record(h.items, 2) == before, "the pair with a stale token changed"
            h.dialect.finish_all(a, h.items, [(2, taken.token)])
            transaction.rollback()
        assert status_of(h, h.items, 2) != Phase.FINISHED.value, (
            "after the autocommitted FINISH, a statement in a rolled back transaction committed"
        )
