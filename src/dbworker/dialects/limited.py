"""Claims of a worker with ``exclusive_by`` or ``rate_limit`` (issue 26), on every
database, in the claim's one transaction.

Exclusivity is the database's own guarantee: a claim stores each record's key in
``held_key``, under a unique index, and every transition out of WORKING clears it
(``core.transitions``). The search below only keeps the claim from colliding with it:
it skips rows whose key a WORKING record of the worker holds (expired or not: an
expired holder is taken over as itself, keeping its key, so a crashed holder's key is
busy until its lease ends and the takeover re-runs it) and takes one row per key. Two
coordinators that pick the same free key at the same moment meet at the unique index:
the second one's UPDATE fails (after waiting for the first to commit). That is claim
contention, not an error. Where a failed statement leaves the transaction usable
(``failed_statement_keeps_transaction``: MySQL rolls back that statement alone) each
record is claimed by its own UPDATE and a row whose key was just taken stays waiting;
elsewhere (PostgreSQL aborts the whole transaction) the claim raises
``ClaimContention`` and the loop claims again a moment later. No savepoint is paid
for on the common path, where nobody races for the key.

A rate limit is enforced by slot rows the claim locks and stamps (``core.limits``):
at most N rows per (worker, key), each the database time it was last used. A claim
takes only slots last used at least a window ago (FOR UPDATE SKIP LOCKED where the
database has row locks; SQLite's claim holds the database-wide write lock) and claims
no more rows than it got slots; the slots of the rows it claimed are stamped and
commit with the claim, or roll back with it. A key's slots are made as claims need
them (never more than N), so a limit far above the rate reached costs a few rows.

Keys are stored as ``stored_key`` makes them (the key's text, or a fixed-length digest
of a text too long for the column), computed in SQL so that the search's test of busy
keys compares like with like.

Every statement is built once per worker and eligible-query shape (``reuse``); the
search returns the records with their keys, read through the source's primary key.
An unlimited worker never comes here: its claim is the dialect's own, unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from typing import cast as typing_cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    Select,
    String,
    Table,
    bindparam,
    cast,
    exists,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.util import ClauseAdapter

from ..core.errors import ClaimContention
from ..core.status import Phase
from .claim_values import KEY_PARAM
from .terms import Claim, Claims, Limits, Owner, WorkerTable

if TYPE_CHECKING:
    from .base import Dialect
    from .claiming import Claiming

log = logging.getLogger("dbworker")

#: Search rounds per claim: each reads past the keys earlier rounds took.
SEARCH_ROUNDS = 4
#: The rate_key of a worker-wide rate limit's slots.
WORKER_WIDE = ""
_ID_PARAM = "dbworker_id"
_WINDOW = "dbworker_window"
_SEEN = "dbworker_seen"
_TAKEN = "dbworker_taken"
_WORKER = "dbworker_worker"
_RATE_KEYS = "dbworker_rate_keys"
_RATE_KEY = "dbworker_rate_key"
_WANTED = "dbworker_wanted"
_SLOT = "dbworker_slot"
_CLAIM_WIDTH = 6  # len(claim_columns(table))


def key_text(expression: ColumnElement[Any]) -> ColumnElement[str]:
    """A key as text (the database's own CAST, so that equal values compare equal in
    SQL and in Python alike); ``Claiming.stored_key`` makes it what is stored."""
    return cast(expression, String())


def is_busy(worker: WorkerTable, key: ColumnElement[str]) -> ColumnElement[bool]:
    """SQL: another record of ``worker`` holds ``key`` (it is WORKING: every ending
    clears ``held_key``). Read through the unique index on ``held_key``."""
    holder = worker.table.alias("dbworker_holder")
    return exists().where(holder.c.held_key == key, holder.c.source_id != worker.source_pk)


@dataclasses.dataclass(slots=True)
class _Pick:
    claim: Claim
    key: str | None
    rate_key: str | None
    slot: int | None = None


def claim_limited(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    eligible: Select[Any],
    limit: int,
    lease_seconds: float,
    owner: Owner,
) -> Claims:
    """Claim up to ``limit`` records of ``worker`` within its limits."""
    limits = worker.limits
    assert limits is not None, "claim_limited is for workers with limits"
    if limit < 1:
        return Claims()
    picks = _search(dialect, conn, worker, limits, eligible, limit)
    if limits.rate is not None and picks:
        picks = _within_rate(dialect, conn, worker, limits, picks)
    if not picks:
        return Claims()
    skipped = 0
    if dialect.supports_concurrent_claims:
        lock = dialect._built_once(
            ("limited lock", worker.table), lambda: _row_lock(dialect, worker, limits)
        )
        rows = conn.execute(lock, {"ids": [p.claim.source_id for p in picks]}).all()
        locked = {row[0]: Claim(*row) for row in rows}
        skipped = len(picks) - len(locked)
        picks = [
            dataclasses.replace(p, claim=locked[p.claim.source_id])
            for p in picks
            if p.claim.source_id in locked
        ]
    # else: one claimer at a time (SQLite's write lock), and the search read each record.
    claimed = _update(dialect, conn, worker, limits, picks, lease_seconds, owner)
    skipped += len(picks) - len(claimed)
    picks = [p for p in picks if p.claim.source_id in claimed]
    if limits.rate is not None:
        _stamp_slots(dialect, conn, worker, limits, picks)
    return Claims.of(
        (
            dataclasses.replace(
                c,
                token=c.token + 1,
                attempts=c.attempts + 1,
                crashes=c.crashes + (c.status == Phase.WORKING.value),
                status=Phase.WORKING.value,
            )
            for c in (p.claim for p in picks)
        ),
        skipped,
    )


def _search(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    limits: Limits,
    eligible: Select[Any],
    limit: int,
) -> list[_Pick]:
    """Claimable rows in the eligible order with their keys, at most one per exclusive
    key and none of a key held, up to ``limit`` (unlocked: the lock comes after)."""
    picks: list[_Pick] = []
    taken: set[str] = set()
    seen: list[Any] = []
    for _ in range(SEARCH_ROUNDS):
        wanted = limit - len(picks)
        window = 2 * wanted + 8
        statement, params = _search_statement(dialect, worker, limits, eligible, bool(seen))
        params[_WINDOW] = window
        if seen:
            params[_SEEN] = seen
            if limits.keyed:
                params[_TAKEN] = sorted(taken)
        params.update(dialect._plan_params(conn))
        rows: Sequence[Any] = conn.execute(statement, params).all()
        if not rows:
            break
        for row in rows:
            if len(picks) >= limit:
                break
            extra = iter(row[_CLAIM_WIDTH:])
            held = next(extra) if limits.keyed else None
            rated = next(extra) if limits.rate_key is not None else None
            if held is not None and held in taken:
                continue
            if held is not None:
                taken.add(held)
            picks.append(_Pick(Claim(*row[:_CLAIM_WIDTH]), held, rated))
        seen += [row[0] for row in rows]
        if len(picks) >= limit or len(rows) < window:
            break
    return picks


def _search_statement(
    dialect: Claiming, worker: WorkerTable, limits: Limits, eligible: Select[Any], later: bool
) -> tuple[Any, dict[str, Any]]:
    """The search, built once per eligible-query shape; ``later``: a round that reads
    past the rows (``_SEEN``) and keys (``_TAKEN``) earlier rounds saw."""

    def build() -> tuple[Any, str]:
        pk = worker.source_pk
        key = _stored(dialect, limits.exclusive_key)
        query = eligible if key is None else eligible.where(~is_busy(worker, key))
        if later:
            query = query.where(pk.not_in(bindparam(_SEEN, expanding=True)))
            if key is not None:
                # A NULL key is nobody's: NOT IN would drop it.
                taken = key.not_in(bindparam(_TAKEN, expanding=True))
                query = query.where(or_(key.is_(None), taken))
        window = bindparam(_WINDOW, 1, type_=Integer())
        search = dialect.candidates(worker, query, typing_cast(int, window), dialect.now())
        keys = [_stored(dialect, e) for e in (limits.exclusive_key, limits.rate_key)]
        lookups = [
            _lookup(worker, search, k, f"dbworker_key_source_{i}")
            for i, k in enumerate(keys)
            if k is not None
        ]
        return dialect._plan_search(search.add_columns(*lookups)), _WINDOW

    from .open_first import reuse  # open_first imports base, which imports this module

    key = ("limited search", worker.table, later)
    return reuse(typing_cast("Dialect", dialect), key, eligible, 0, build)


def _stored(dialect: Claiming, expression: ColumnElement[Any] | None) -> Any:
    return None if expression is None else dialect.stored_key(key_text(expression))


def _lookup(
    worker: WorkerTable, search: Select[Any], key: ColumnElement[str], name: str
) -> ColumnElement[Any]:
    """``key`` of each record the search returns, read by the source's primary key in a
    scalar subquery (the search may hide the source table inside a lateral lookup or a
    union, and its ORDER BY stays the statement's own)."""
    source = worker.source_pk.table
    assert isinstance(source, Table)
    adapter = ClauseAdapter(source.alias(name))
    record_id = search.selected_columns[0]
    row = select(adapter.traverse(key)).where(adapter.traverse(worker.source_pk) == record_id)
    if worker.source_filter is not None:
        row = row.where(adapter.traverse(worker.source_filter))
    return row.scalar_subquery()


def _row_lock(dialect: Claiming, worker: WorkerTable, limits: Limits) -> Any:
    """The dialect's lock of the records ``ids``, with its ``key_guard`` if it has one."""
    lock = dialect._row_lock(worker.table)
    key = _stored(dialect, limits.exclusive_key)
    if key is None:
        return lock
    guard = dialect.key_guard(worker.name, _lookup(worker, lock, key, "dbworker_key_source"))
    return lock if guard is None else lock.where(guard)


def _within_rate(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, picks: list[_Pick]
) -> list[_Pick]:
    """The picks, in order, for which a rate slot is free, each with its slot (locked
    until the claim ends)."""
    wanted: dict[str, int] = {}
    for pick in picks:
        if limits.rate_key is None or pick.rate_key is not None:
            name = WORKER_WIDE if limits.rate_key is None else str(pick.rate_key)
            wanted[name] = wanted.get(name, 0) + 1
    free = _free_slots(dialect, conn, worker, limits, wanted)
    kept: list[_Pick] = []
    for pick in picks:
        if limits.rate_key is not None and pick.rate_key is None:
            kept.append(pick)  # a NULL key is limited by nothing
            continue
        name = WORKER_WIDE if limits.rate_key is None else str(pick.rate_key)
        if free.get(name):
            kept.append(dataclasses.replace(pick, rate_key=name, slot=free[name].pop()))
    return kept


def _free_slots(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, wanted: dict[str, int]
) -> dict[str, list[int]]:
    """The free slot numbers each key got (locked until the claim ends), making a key's
    slots as they are needed, up to its rate's N."""
    assert limits.slots is not None and limits.rate is not None
    slots, count = limits.slots, limits.rate.count
    got = _lock_slots(dialect, conn, worker, limits, wanted)
    short = sorted(k for k, n in wanted.items() if len(got.get(k, ())) < n)
    if not short:
        return got
    made = _built(dialect, ("slot count", worker.table), lambda: _slot_count(slots))
    existing = {k: int(n) for k, n in conn.execute(made, {_WORKER: worker.name, _RATE_KEYS: short})}
    values = [
        {"worker": worker.name, "rate_key": k, "slot": n, "used_at": 0.0}
        for k in short
        for n in range(
            existing.get(k, 0), min(count, existing.get(k, 0) + wanted[k] - len(got.get(k, ())))
        )
    ]
    if values:
        _make_slots(dialect, conn, slots, values)
    # Rows this transaction locked or made are its own: SKIP LOCKED skips only others'.
    got.update(_lock_slots(dialect, conn, worker, limits, {k: wanted[k] for k in short}))
    return got


def _make_slots(
    dialect: Claiming, conn: Connection, slots: Table, values: list[dict[str, Any]]
) -> None:
    """Insert new free slots; another coordinator may make the same numbers at once,
    and the first one's stay. Slots are capacity, not claims: where claims run
    concurrently they are made in a transaction of their own, committed at once, so
    that no claim waits for another's uncommitted slots (SQLite's claim holds the only
    write lock, so it makes them itself)."""
    insert = dialect.insert_ignore(slots, ("worker", "rate_key", "slot"))
    if not dialect.supports_concurrent_claims:
        conn.execute(insert, values)
        return
    with conn.engine.connect() as own, own.begin():
        own.execute(insert, values)


def _lock_slots(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, wanted: dict[str, int]
) -> dict[str, list[int]]:
    assert limits.slots is not None and limits.rate is not None
    slots, seconds = limits.slots, limits.rate.seconds
    one = len(wanted) == 1

    def build() -> Any:
        query = select(slots.c.rate_key, slots.c.slot).where(
            slots.c.worker == bindparam(_WORKER),
            slots.c.rate_key.in_(bindparam(_RATE_KEYS, expanding=True)),
            slots.c.used_at <= dialect.now() - seconds,
        )
        if one:  # lock no more slots than this claim can use
            query = query.limit(bindparam(_WANTED, type_=Integer()))
        # SKIP LOCKED: another coordinator's claim holds those slots until it ends.
        # (SQLAlchemy drops FOR UPDATE on SQLite, whose claim holds the write lock.)
        return query.with_for_update(skip_locked=True)

    statement = _built(dialect, ("slot lock", worker.table, one), build)
    params: dict[str, Any] = {_WORKER: worker.name, _RATE_KEYS: sorted(wanted)}
    if one:
        params[_WANTED] = next(iter(wanted.values()))
    got: dict[str, list[int]] = {}
    for name, slot in conn.execute(statement, params):
        got.setdefault(name, []).append(int(slot))
    return got


def _slot_count(slots: Table) -> Any:
    return (
        select(slots.c.rate_key, func.count())
        .where(
            slots.c.worker == bindparam(_WORKER),
            slots.c.rate_key.in_(bindparam(_RATE_KEYS, expanding=True)),
        )
        .group_by(slots.c.rate_key)
    )


def _stamp_slots(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, picks: list[_Pick]
) -> None:
    """Stamp the slot of each claimed pick with the database's time."""
    assert limits.slots is not None
    slots = limits.slots
    params = [
        {_WORKER: worker.name, _RATE_KEY: p.rate_key, _SLOT: p.slot}
        for p in picks
        if p.slot is not None
    ]
    if not params:
        return

    def build() -> Any:
        return (
            update(slots)
            .where(
                slots.c.worker == bindparam(_WORKER),
                slots.c.rate_key == bindparam(_RATE_KEY),
                slots.c.slot == bindparam(_SLOT),
            )
            .values(used_at=dialect.now())
        )

    conn.execute(_built(dialect, ("slot stamp", worker.table), build), params)


def _built(dialect: Claiming, key: tuple[Any, ...], build: Any) -> Any:
    return dialect._built_once(key, build)


def _update(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    limits: Limits,
    picks: list[_Pick],
    lease_seconds: float,
    owner: Owner,
) -> set[Any]:
    """Claim the locked ``picks``; the ids claimed (all, but for key contention)."""
    if not picks:
        return set()
    table = worker.table
    if not limits.keyed:
        statement = dialect._built_once(
            ("claim", table, lease_seconds, owner),
            lambda: dialect._claim_update(table, lease_seconds, owner),
        )
        conn.execute(statement, {"ids": [p.claim.source_id for p in picks]})
        return {p.claim.source_id for p in picks}
    statement = dialect._built_once(
        ("keyed claim", table, lease_seconds, owner),
        lambda: _keyed_update(dialect, table, lease_seconds, owner),
    )
    # In key order: two claims that write the same keys wait for each other in one
    # order, never in a cycle (a deadlock).
    params = [
        {_ID_PARAM: p.claim.source_id, KEY_PARAM: p.key}
        for p in sorted(picks, key=lambda p: (p.key is None, p.key or ""))
    ]
    if not dialect.supports_concurrent_claims:
        # One claimer at a time (SQLite's write lock): the search saw every holder.
        conn.execute(statement, params)
        return {p.claim.source_id for p in picks}
    if not dialect.failed_statement_keeps_transaction:
        try:
            conn.execute(statement, params)
        except IntegrityError as exc:
            # The transaction is lost (PostgreSQL): claim again, in a moment.
            raise ClaimContention(
                f"a key of worker={worker.name} was just taken by another claim"
            ) from exc
        return {p.claim.source_id for p in picks}
    claimed: set[Any] = set()
    for one in params:
        try:
            conn.execute(statement, one)
            claimed.add(one[_ID_PARAM])
        except IntegrityError:
            log.debug(
                "key %r of worker=%s is held by another coordinator's claim; it waits",
                one[KEY_PARAM],
                worker.name,
            )
    return claimed


def _keyed_update(dialect: Claiming, table: Table, lease_seconds: float, owner: Owner) -> Any:
    """The claim UPDATE of one record, with its key (``KEY_PARAM``) for ``held_key``."""
    return (
        update(table)
        .where(table.c.source_id == bindparam(_ID_PARAM))
        .ordered_values(*dialect._claim_values(table, lease_seconds, owner))
    )
