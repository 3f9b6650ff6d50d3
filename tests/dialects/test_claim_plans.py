"""A claim's plan stays bounded where no statistics describe the tables, asserted from the
database's own plan, not from a clock.

Each test builds thousands of FINISHED records with thousands of open ones above them
(new rows, discovered), on tables nobody analyzed (PostgreSQL autovacuum off for them,
InnoDB statistics never recalculated) or analyzed before the backlog arrived, when no
work was open (the statistics then say open records are rare). Then the backlog churns:
claims take records through the dialect on the database's clock (the production path)
and finish them, a few fail with a long retry delay (open, not claimable, in front of the
work), the last claims stay WORKING. Then one more claim is captured statement by
statement and replayed under the database's plan reporting:

* PostgreSQL: EXPLAIN (ANALYZE, BUFFERS) of every statement of the claim (inside a
  transaction that is rolled back), which must read fewer than ``PG_MAX_BUFFERS`` shared
  buffers in all. A plan that visits every open record reads thousands.
* SQLite: EXPLAIN QUERY PLAN: no temporary B-tree for the ORDER BY (which means every
  claimable record was read and sorted), and the execution table read through the
  open-records index.
* MariaDB / MySQL: ANALYZE FORMAT=JSON (executed, rolled back): the execution table is read
  through its status index or primary key, never scanned whole, and the rows read from it
  stay under ``MYSQL_MAX_ROWS``.

The backlog then churns again and the claim is measured again: the bound holds as
records move through it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, insert, select

from dbworker.dialects import Claim, ErrorInfo, for_url
from dbworker.testing.harness import LEASE, OWNER, Harness, ids
from dbworker.testing.models import Group, Item

HISTORY = 3000
OPEN = 5000
#: Each churn round claims this many records, finishes them (one in FAIL_EVERY fails with a
#: long retry delay instead); the last round's claims stay WORKING.
CHURN_BATCH = 25
FAIL_EVERY = 40
CLAIM_LIMIT = 4

#: Shared buffers one claim may read in all its statements on PostgreSQL. The bounded
#: plan reads 90-150 here (the UPDATE of four rows and their index entries, the records
#: in front of the work: WORKING, delayed, and the dead index entries churn leaves with
#: autovacuum off); the plan that visits every open record read 12,000.
PG_MAX_BUFFERS = 400
#: Execution rows one claim may read on MySQL/MariaDB: about 150 here (each status part
#: of the search reads its window or, for WORKING and delayed UNFINISHED records, all of
#: them; then the rows it locks and updates); the backlog is 5,000.
MYSQL_MAX_ROWS = 300

STATS = ("never", "before_backlog")
#: How long churn waits for older transactions elsewhere on the server to end.
HORIZON_WAIT_SECONDS = 60.0


def _eligible() -> Any:
    return select(Item).where(Item.enabled.is_(True)).order_by(Item.id)


def _load(h: Harness, stats: str) -> None:
    table = h.items.table
    with h.app_engine.begin() as conn:
        backend = conn.dialect.name
        names = [Item.__tablename__, table.name]
        if backend == "postgresql":
            for name in names:
                conn.exec_driver_sql(f"ALTER TABLE {name} SET (autovacuum_enabled = false)")
        elif backend in ("mysql", "mariadb"):
            for name in names:
                conn.exec_driver_sql(f"ALTER TABLE {name} STATS_AUTO_RECALC = 0")
        conn.execute(insert(Group), [{"id": 1, "active": True}])
        conn.execute(
            insert(Item),
            [
                {"id": i, "group_id": 1, "enabled": True, "priority": i}
                for i in range(1, HISTORY + 1)
            ],
        )
        conn.execute(
            insert(table),
            [
                {"source_id": i, "status": "finished", "token": 1, "attempts": 1}
                for i in range(1, HISTORY + 1)
            ],
        )
    if stats == "before_backlog":
        _analyze(h.app_engine, names)
    with h.app_engine.begin() as conn:
        conn.execute(
            insert(Item),
            [
                {"id": i, "group_id": 1, "enabled": True, "priority": i}
                for i in range(HISTORY + 1, HISTORY + OPEN + 1)
            ],
        )
    for _ in range(OPEN // h.dialect.discovery_batch + 1):
        h.discover(h.items)


def _analyze(engine: Engine, names: list[str]) -> None:
    with engine.begin() as conn:
        backend = conn.dialect.name
        if backend == "sqlite":
            conn.exec_driver_sql("ANALYZE")
        for name in names:
            if backend == "postgresql":
                conn.exec_driver_sql(f"ANALYZE {name}")
            elif backend in ("mysql", "mariadb"):
                conn.exec_driver_sql(f"ANALYZE TABLE {name}").all()


def _churn(h: Harness, rounds: int) -> None:
    """``rounds`` claims of CHURN_BATCH; all but the last round's end FINISHED or UNFINISHED
    with a retry delay far in the future."""
    conn = h.admin
    held: list[Claim] = []
    for _ in range(rounds):
        _wait_for_older_transactions(conn)
        for n, claim in enumerate(held):
            with conn.begin():
                if n % FAIL_EVERY == 0:
                    error = ErrorInfo("retry later", "RuntimeError")
                    assert h.dialect.fail(conn, h.items, claim.source_id, claim.token, error, 3600)
                else:
                    assert h.dialect.finish(conn, h.items, claim.source_id, claim.token)
        with conn.begin():
            held = h.dialect.claim(conn, h.items, _eligible(), CHURN_BATCH, LEASE, OWNER)
        assert len(held) == CHURN_BATCH


def _wait_for_older_transactions(conn: Connection) -> None:
    """On PostgreSQL, wait until no session on the server (in any database: a concurrent
    test's, on the other xdist worker) holds a transaction or snapshot older than now.

    Until then the rows churn updated stay visible to that session, so the claims'
    scans cannot mark their dead index entries, and the measured claim reads each one
    (2,100 buffers after 1,000 records moved): what any PostgreSQL workload pays while a
    long transaction is open, not what this test is about, which is the plan's shape.
    """
    if conn.dialect.name != "postgresql":
        return
    deadline = time.monotonic() + HORIZON_WAIT_SECONDS
    with conn.begin():
        mark = conn.exec_driver_sql("SELECT pg_snapshot_xmax(pg_current_snapshot())::xid")
        now = mark.scalar_one()
    while True:
        with conn.begin():
            older = conn.exec_driver_sql(
                "SELECT pid, datname, state, left(query, 80) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND (age(backend_xmin) > age(%(now)s::xid)"
                " OR age(backend_xid) > age(%(now)s::xid))",
                {"now": str(now)},
            ).all()
        if not older:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"older transactions did not end in {HORIZON_WAIT_SECONDS}s: {older}")
        time.sleep(0.02)


@contextmanager
def _captured(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _claim_statements(h: Harness) -> tuple[list[Any], list[tuple[str, Any]]]:
    """A claim (rolled back) and the statements it ran, in order."""
    conn = h.admin
    with _captured(conn.engine) as seen:
        transaction = conn.begin()
        try:
            claims = h.dialect.claim(conn, h.items, _eligible(), CLAIM_LIMIT, LEASE, OWNER)
        finally:
            transaction.rollback()
    statements = [
        (statement, parameters)
        for statement, parameters in seen
        if statement.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE", "("))
    ]
    return ids(claims), statements


def _expected_next(h: Harness) -> list[int]:
    """The claimable keys, in order, that the next claim must take."""
    table = h.items.table
    with h.app_engine.connect() as conn:
        query = (
            select(table.c.source_id)
            .where(table.c.status == "pending")
            .order_by(table.c.source_id)
            .limit(CLAIM_LIMIT)
        )
        return list(conn.execute(query).scalars())


def _postgresql_buffers(conn: Connection, statements: list[tuple[str, Any]]) -> tuple[int, Any]:
    total, plans = 0, []
    with conn.begin() as transaction:
        for statement, parameters in statements:
            explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement
            plan = conn.exec_driver_sql(explain, parameters).scalar_one()[0]["Plan"]
            total += plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
            plans.append(plan)
        transaction.rollback()
    return total, plans


def _sqlite_plans(conn: Connection, statements: list[tuple[str, Any]]) -> list[list[str]]:
    plans = []
    for statement, parameters in statements:
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
        plans.append([str(row[-1]) for row in rows])
    conn.rollback()
    return plans


def _mysql_accesses(conn: Connection, statements: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Every table access of every statement, as ANALYZE FORMAT=JSON reports it."""
    accesses: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "table_name" in node:
                accesses.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    with conn.begin() as transaction:
        for statement, parameters in statements:
            walk(
                json.loads(
                    conn.exec_driver_sql(
                        "ANALYZE FORMAT=JSON " + statement, parameters
                    ).scalar_one()
                )
            )
        transaction.rollback()
    return accesses


def _assert_bounded(h: Harness, when: str) -> None:
    expected = _expected_next(h)
    claimed, statements = _claim_statements(h)
    assert claimed == expected, (
        f"{when}: the claim took {claimed}, the next claimable are {expected}"
    )
    conn, table = h.admin, h.items.table
    backend = conn.dialect.name
    if backend == "postgresql":
        buffers, plans = _postgresql_buffers(conn, statements)
        assert buffers < PG_MAX_BUFFERS, (
            f"{when}: a claim read {buffers} buffers (bound {PG_MAX_BUFFERS}) with {OPEN} open "
            f"and {HISTORY} finished records; plans: {json.dumps(plans, indent=1)[:6000]}"
        )
    elif backend == "sqlite":
        plans = _sqlite_plans(conn, statements)
        index = f"{table.name}_open_ix"
        for plan in plans:
            assert not any("TEMP B-TREE FOR ORDER BY" in line for line in plan), (
                f"{when}: a claim sorts every claimable record: {plan}"
            )
        assert any(index in line for plan in plans for line in plan), (
            f"{when}: no claim statement reads the open-records index {index}: {plans}"
        )
    else:
        accesses = _mysql_accesses(conn, statements)
        ours = [a for a in accesses if a["table_name"] == table.name]
        assert ours, f"{when}: no access to {table.name} in {accesses}"
        allowed = {"PRIMARY", f"{table.name}_status_ix", f"{table.name}_open_ix"}
        for access in accesses:
            # (A derived table, the union of the search's parts, is read whole: it holds
            # a few rows per part.)
            if not access["table_name"].startswith("<"):
                assert access.get("access_type") != "ALL", f"{when}: a full scan: {access}"
        for access in ours:
            assert access.get("key") in allowed, f"{when}: read through {access.get('key')}"
        read = sum((a.get("r_rows") or 0) * (a.get("r_loops") or 0) for a in ours)
        assert read < MYSQL_MAX_ROWS, (
            f"{when}: a claim read {read} execution rows (bound {MYSQL_MAX_ROWS}): {ours}"
        )


@pytest.mark.parametrize("stats", STATS)
def test_claim_plan_is_bounded_without_statistics(database_url: str, stats: str) -> None:
    with Harness(lambda _clock: for_url(database_url), database_url) as h:
        _load(h, stats)
        _churn(h, rounds=40)
        _assert_bounded(h, "after 1,000 records moved through the backlog")
        _churn(h, rounds=40)
        _assert_bounded(h, "after 2,000 records moved through the backlog")
        if stats == "never" and h.admin.dialect.name == "postgresql":
            with h.app_engine.connect() as conn:
                analyzed = conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_user_tables WHERE relname IN (%(a)s, %(b)s)"
                    " AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)",
                    {"a": Item.__tablename__, "b": h.items.table.name},
                ).scalar_one()
            assert analyzed == 0, "the tables were analyzed after all"
