"""Claims on the database's clock: one statement where the database allows it, built once
per eligible-query shape, returning what it stored, in claim order.

The conformance checks run on a fake clock, which turns statement reuse off; here the
production path runs: PostgreSQL claims with one statement (after the one that prices
statistics-dependent plans out, and which the claim itself undoes), SQLite in key order
with one UPDATE ... RETURNING, MySQL with its search, lock and UPDATE.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import select

from dbworker.dialects import Claim, for_url
from dbworker.dialects.postgresql import PLAN_SETTINGS
from dbworker.testing.harness import LEASE, OWNER, Harness, ids
from dbworker.testing.models import ITEMS, Item

from .support import statements_run

#: What the database stores for a claim, as the claim must report it.
FIELDS = ("token", "attempts", "failures", "crashes", "status")


def _db_clock(url: str) -> Harness:
    return Harness(lambda _clock: for_url(url), url)


def _claim(h: Harness, eligible: Any, limit: int, lease: float = LEASE) -> list[Claim]:
    with h.admin.begin():
        return h.dialect.claim(h.admin, h.items, eligible, limit, lease, OWNER)


def _assert_stored(h: Harness, claims: list[Claim]) -> None:
    records = h.records(h.items)
    for claim in claims:
        stored = tuple(records[claim.source_id][name] for name in FIELDS)
        assert (claim.token, claim.attempts, claim.failures, claim.crashes, claim.status) == (
            stored
        ), f"{claim} does not report the record as stored: {stored}"


def test_statements_per_claim(database_url: str) -> None:
    with _db_clock(database_url) as h:
        h.seed()
        h.discover(h.items)
        by_key = select(Item).order_by(Item.id)
        with statements_run(h.admin) as seen:
            claims = _claim(h, by_key, 3)
        assert ids(claims) == [1, 2, 3]
        _assert_stored(h, claims)
        sql = [s for s in seen if not s.upper().startswith(("BEGIN", "COMMIT", "ROLLBACK"))]
        backend = h.admin.dialect.name
        if backend == "postgresql":
            assert len(sql) == 2, sql
            assert "set_config" in sql[0] and "FOR UPDATE" not in sql[0], sql[0]
            assert sql[1].startswith("WITH dbworker_locked AS MATERIALIZED"), sql[1]
            assert "FOR UPDATE OF" in sql[1] and "SKIP LOCKED" in sql[1], sql[1]
        elif backend == "sqlite":
            assert len(sql) == 1, sql
            assert sql[0].startswith("UPDATE") and "RETURNING" in sql[0], sql[0]
        else:
            # No UPDATE ... RETURNING: search, lock by key (SKIP LOCKED), UPDATE.
            assert [s.split()[0] for s in sql] == ["SELECT", "SELECT", "UPDATE"], sql


def test_reused_statements_bind_each_claims_values(database_url: str) -> None:
    """One statement serves every eligible query of one shape: each claim must use its
    own parameters and limit, never those of the claim that built the statement."""
    with _db_clock(database_url) as h:
        h.seed()
        h.discover(h.items)

        def above(priority: int) -> Any:
            return select(Item).where(Item.priority > priority).order_by(Item.id)

        def expected(priority: int, taken: set[int], limit: int) -> list[int]:
            rows = [r.id for r in sorted(ITEMS, key=lambda r: r.id) if r.priority > priority]
            return [i for i in rows if i not in taken][:limit]

        taken: set[int] = set()
        for priority, limit in ((60, 1), (60, 2), (10, 3), (85, 5), (0, 100)):
            want = expected(priority, taken, limit)
            got = _claim(h, above(priority), limit)
            assert ids(got) == want, f"priority > {priority}, limit {limit}: {ids(got)} != {want}"
            _assert_stored(h, got)
            taken.update(ids(got))
        assert taken == {r.id for r in ITEMS}


def test_claim_order_key_descending_and_other_orders(database_url: str) -> None:
    with _db_clock(database_url) as h:
        h.seed()
        h.discover(h.items)
        descending = _claim(h, select(Item).order_by(Item.id.desc()), 3)
        assert ids(descending) == [12, 11, 10]
        by_priority = _claim(h, select(Item).order_by(Item.priority.desc(), Item.id), 4)
        left = sorted((r for r in ITEMS if r.id < 10), key=lambda r: -r.priority)
        assert ids(by_priority) == [r.id for r in left[:4]]
        _assert_stored(h, descending + by_priority)


def test_takeover_reports_the_stored_counters(database_url: str) -> None:
    """A takeover on the database's clock: new token, one more attempt, the vanished
    holder counted as a crash, as the claim's UPDATE stored them."""
    with _db_clock(database_url) as h:
        h.seed()
        h.discover(h.items)
        only_one = select(Item).where(Item.id == 5).order_by(Item.id)
        first = _claim(h, only_one, 1, lease=0.05)
        time.sleep(0.3)
        second = _claim(h, only_one, 1)
        assert ids(first) == ids(second) == [5]
        (taken,) = second
        assert (taken.token, taken.attempts, taken.crashes) == (first[0].token + 1, 2, 1)
        _assert_stored(h, second)


@pytest.mark.backends("postgresql")
def test_plan_settings_apply_to_the_claim_statement_only(database_url: str) -> None:
    with _db_clock(database_url) as h:
        h.seed()
        h.discover(h.items)
        conn = h.admin
        names = ", ".join(f"current_setting('{name}')" for name in PLAN_SETTINGS)
        # The caller's own settings, session-wide and transaction-local, survive a claim
        # that claims rows and one that finds none.
        conn.exec_driver_sql("SET jit = off")
        conn.commit()
        with conn.begin():
            conn.exec_driver_sql("SET LOCAL enable_sort = off")
            before = conn.exec_driver_sql(f"SELECT {names}").one()
            for eligible in (select(Item).order_by(Item.id), select(Item).where(Item.id < 0)):
                for _ in range(7):  # past psycopg's prepare threshold
                    h.dialect.claim(conn, h.items, eligible, 1, LEASE, OWNER)
                    assert conn.exec_driver_sql(f"SELECT {names}").one() == before
        assert tuple(before) == ("on", "on", "off", "off")


@pytest.mark.backends("sqlite")
def test_sqlite_without_returning_claims_in_two_statements(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _db_clock(database_url) as h:
        h.seed()
        h.discover(h.items)
        monkeypatch.setattr(h.admin.dialect, "update_returning", False)
        with statements_run(h.admin) as seen:
            claims = _claim(h, select(Item).order_by(Item.id), 2)
        assert ids(claims) == [1, 2]
        _assert_stored(h, claims)
        assert not any("RETURNING" in statement for statement in seen), seen


def _settings(conn: Any) -> tuple[Any, ...]:
    names = ", ".join(f"current_setting('{name}')" for name in PLAN_SETTINGS)
    return tuple(conn.exec_driver_sql(f"SELECT {names}").one())


def _sql(seen: list[str]) -> list[str]:
    return [s for s in seen if not s.upper().startswith(("BEGIN", "COMMIT", "ROLLBACK"))]


@pytest.mark.backends("postgresql")
def test_a_discovery_before_a_claim_carries_its_plan_guard(database_url: str) -> None:
    # A woken poll: discovery switches the plan settings off for the claim after it (a
    # round trip less), and the claim restores the caller's own.
    with _db_clock(database_url) as h:
        h.seed()
        conn = h.admin
        by_key = select(Item).order_by(Item.id)
        with conn.begin():
            conn.exec_driver_sql("SET LOCAL enable_sort = off")
            before = _settings(conn)
            with statements_run(conn) as seen:
                _, watermark = h.dialect.discover_for_claim(conn, h.items)
            assert watermark == max(row.id for row in ITEMS)
            assert _settings(conn) == ("off",) * len(PLAN_SETTINGS)
            with statements_run(conn) as claimed:
                claims = h.dialect.claim(conn, h.items, by_key, 2, LEASE, OWNER)
            assert _settings(conn) == before == ("on", "on", "off", "on")
        assert ids(claims) == [1, 2]
        _assert_stored(h, claims)
        assert len(_sql(seen)) == 1 and "set_config" in _sql(seen)[0], seen
        (claim,) = _sql(claimed)
        assert claim.startswith("WITH dbworker_locked AS MATERIALIZED"), claim


@pytest.mark.backends("postgresql")
def test_a_plan_guard_serves_only_its_own_transaction(database_url: str) -> None:
    with _db_clock(database_url) as h:
        h.seed()
        conn = h.admin
        by_key = select(Item).order_by(Item.id)
        with conn.begin():  # discovered, then nothing claimed: its guard ends with it
            h.dialect.discover_for_claim(conn, h.items)
        with conn.begin():
            assert _settings(conn) == ("on", "on", "on", "on")
            with statements_run(conn) as seen:
                claims = h.dialect.claim(conn, h.items, by_key, 1, LEASE, OWNER)
            assert _settings(conn) == ("on", "on", "on", "on")
        assert ids(claims) == [1]
        guard, claim = _sql(seen)
        assert "set_config" in guard and "FOR UPDATE" not in guard, guard
        assert claim.startswith("WITH dbworker_locked AS MATERIALIZED"), claim
        # A discovery that no claim follows leaves the settings alone.
        h.add_items(100)
        with conn.begin():
            assert h.dialect.discover_to_watermark(conn, h.items) == (1, 100)
            assert _settings(conn) == ("on", "on", "on", "on")


def test_a_discovery_of_its_own_keeps_the_claims_guard_apart(database_url: str) -> None:
    # A dialect that writes its own discovery gets it run as written before a claim.
    base = type(for_url(database_url))

    class OwnDiscovery(base):  # type: ignore[valid-type,misc]
        def discover_to_watermark(self, conn: Any, worker: Any) -> tuple[int, Any]:
            self.ran = True
            found: tuple[int, Any] = super().discover_to_watermark(conn, worker)
            return found

    assert not OwnDiscovery.prepares_claim_in_discovery
    with Harness(lambda _clock: OwnDiscovery(), database_url) as h:
        h.seed()
        with h.admin.begin():
            assert h.dialect.discover_for_claim(h.admin, h.items)[0] == len(ITEMS)
        assert getattr(h.dialect, "ran", False)
