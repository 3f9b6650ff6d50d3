"""Claims of a worker with ``exclusive_by`` or ``rate_limit`` (issue 26), on every
database, in the claim's one transaction.

Exclusivity is the database's own guarantee: a claim stores each record's key in
``held_key``, under a unique index, and every transition out of WORKING clears it
(``core.transitions``). The search below only keeps the claim from colliding with it:
it skips rows whose key a WORKING record of the worker holds (expired or not: an
expired holder is taken over as itself, keeping its key, so a crashed holder's key is
busy until its lease ends and the takeover re-runs it) and takes one row per key. Two
coordinators that pick the same free key at the same moment meet at the unique index:
the second one's UPDATE fails (after waiting for the first to commit), and that is
claim contention, not an error: its batch is claimed again row by row, each in a
savepoint, and the rows whose key was just taken stay waiting.

A rate limit is enforced by slot rows the claim locks and stamps (``core.limits``):
N rows per (worker, key), each the database time it was last used. A claim takes only
slots last used at least a window ago (FOR UPDATE SKIP LOCKED where the database has
row locks; SQLite's claim holds the database-wide write lock) and claims no more rows
than it got slots; the slots it stamped commit with the claim, or roll back with it.

An unlimited worker never comes here: its claim is the dialect's own, unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    String,
    Table,
    bindparam,
    cast,
    exists,
    func,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from ..core.status import Phase
from .claim_values import KEY_PARAM
from .terms import Claim, Claims, Limits, Owner, WorkerTable

if TYPE_CHECKING:
    from .claiming import Claiming

log = logging.getLogger("dbworker")
T = TypeVar("T")

#: Search rounds per claim: each reads past the keys earlier rounds took.
SEARCH_ROUNDS = 4
#: The rate_key of a worker-wide rate limit's slots.
WORKER_WIDE = ""
_ID_PARAM = "dbworker_id"


def key_text(expression: ColumnElement[Any]) -> ColumnElement[str]:
    """A key as the text ``held_key`` and the slots store (the database's own CAST, so
    that equal values compare equal in SQL and in Python alike)."""
    return cast(expression, String())


def is_busy(worker: WorkerTable, key: ColumnElement[str]) -> ColumnElement[bool]:
    """SQL: another record of ``worker`` holds ``key`` (it is WORKING: every ending
    clears ``held_key``). Read through the unique index on ``held_key``."""
    holder = worker.table.alias("dbworker_holder")
    return exists().where(holder.c.held_key == key, holder.c.source_id != worker.source_pk)


@dataclasses.dataclass(slots=True)
class _Pick:
    source_id: Any
    key: str | None
    rate_key: str | None


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
    lock = dialect._built_once(
        ("limited lock", worker.table), lambda: dialect._row_lock(worker.table)
    )
    rows = conn.execute(lock, {"ids": [p.source_id for p in picks]}).all()
    locked = {row[0]: Claim(*row) for row in rows}
    skipped = len(picks) - len(locked)
    picks = [p for p in picks if p.source_id in locked]
    if limits.rate is not None:
        _stamp_slots(dialect, conn, worker, limits, picks)
    claimed = _update(dialect, conn, worker, limits, picks, lease_seconds, owner)
    skipped += len(picks) - len(claimed)
    return Claims.of(
        (
            dataclasses.replace(
                c,
                token=c.token + 1,
                attempts=c.attempts + 1,
                crashes=c.crashes + (c.status == Phase.WORKING.value),
                status=Phase.WORKING.value,
            )
            for c in (locked[p.source_id] for p in picks if p.source_id in claimed)
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
    """Claimable rows in the eligible order, at most one per exclusive key and none of
    a key held, up to ``limit`` (unlocked: the lock comes after, by primary key)."""
    pk = worker.source_pk
    key = None if limits.exclusive_key is None else key_text(limits.exclusive_key)
    rate_key = None if limits.rate_key is None else key_text(limits.rate_key)
    query = eligible if key is None else eligible.where(~is_busy(worker, key))
    picks: list[_Pick] = []
    taken: set[str] = set()
    seen: list[Any] = []
    for _ in range(SEARCH_ROUNDS):
        wanted = limit - len(picks)
        window = 2 * wanted + 8
        narrowed = query.where(pk.not_in(seen)) if seen else query
        if taken and key is not None:
            narrowed = narrowed.where(key.not_in(sorted(taken)))
        search = dialect.candidates(worker, narrowed, window, dialect.now())
        rows: Sequence[Any] = dialect._planned(conn, functools.partial(_all, conn, search))
        found = [row[0] for row in rows]
        if not found:
            break
        keys = _keys(conn, pk, key, rate_key, found)
        for source_id in found:
            if source_id not in keys or len(picks) >= limit:
                continue  # deleted meanwhile, or enough
            held, rated = keys[source_id]
            if held is not None and held in taken:
                continue
            if held is not None:
                taken.add(held)
            picks.append(_Pick(source_id, held, rated))
        seen += found
        if len(picks) >= limit or len(found) < window:
            break
    return picks


def _all(conn: Connection, statement: Any) -> Sequence[Any]:
    return conn.execute(statement).all()


def _keys(
    conn: Connection,
    pk: ColumnElement[Any],
    key: ColumnElement[str] | None,
    rate_key: ColumnElement[str] | None,
    ids: Sequence[Any],
) -> dict[Any, tuple[str | None, str | None]]:
    """Each row's keys, read without locks (``candidates`` returns execution records,
    and on PostgreSQL cannot carry source columns out of its lateral lookup)."""
    if key is None and rate_key is None:
        return {i: (None, None) for i in ids}
    columns = [c for c in (key, rate_key) if c is not None]
    rows = conn.execute(select(pk, *columns).where(pk.in_(ids))).all()
    result: dict[Any, tuple[str | None, str | None]] = {}
    for row in rows:
        values = iter(row[1:])
        held = next(values) if key is not None else None
        rated = next(values) if rate_key is not None else None
        result[row[0]] = (held, rated)
    return result


def _within_rate(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, picks: list[_Pick]
) -> list[_Pick]:
    """The picks, in order, for which a rate slot is free; locks those slots."""
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
            kept.append(dataclasses.replace(pick, rate_key=name))
            free[name] -= 1
    return kept


def _free_slots(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, wanted: dict[str, int]
) -> dict[str, int]:
    """How many free slots each key got (locked until the claim commits), making a
    key's slots the first time it is seen."""
    assert limits.slots is not None and limits.rate is not None
    slots, rate = limits.slots, limits.rate
    now = dialect.now()

    def lock(keys: list[str]) -> dict[str, int]:
        query = select(slots.c.rate_key).where(
            slots.c.worker == worker.name,
            slots.c.rate_key.in_(keys),
            slots.c.used_at <= now - rate.seconds,
        )
        if len(keys) == 1:  # lock no more slots than this claim can use
            query = query.limit(wanted[keys[0]])
        # SKIP LOCKED: another coordinator's claim holds those slots until it commits.
        # (SQLAlchemy drops FOR UPDATE on SQLite, whose claim holds the write lock.)
        counts: dict[str, int] = {}
        for (name,) in conn.execute(query.with_for_update(skip_locked=True)):
            counts[name] = counts.get(name, 0) + 1
        return counts

    got = lock(sorted(wanted))
    short = sorted(k for k, n in wanted.items() if got.get(k, 0) < n)
    if short:
        count = select(slots.c.rate_key, func.count()).where(
            slots.c.worker == worker.name, slots.c.rate_key.in_(short)
        )
        made: dict[str, int] = {
            k: int(n) for k, n in conn.execute(count.group_by(slots.c.rate_key))
        }
        missing = [k for k in short if made.get(k, 0) < rate.count]
        if missing:
            values = [
                {"worker": worker.name, "rate_key": k, "slot": n, "used_at": 0.0}
                for k in missing
                for n in range(rate.count)
            ]
            conn.execute(dialect.insert_ignore(slots, ("worker", "rate_key", "slot")), values)
            got.update(lock(missing))
    return got


def _stamp_slots(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, picks: list[_Pick]
) -> None:
    """Stamp one locked free slot per claimed pick with the database's time."""
    assert limits.slots is not None and limits.rate is not None
    slots, rate = limits.slots, limits.rate
    per_key: dict[str, int] = {}
    for pick in picks:
        if pick.rate_key is not None:
            per_key[pick.rate_key] = per_key.get(pick.rate_key, 0) + 1
    now = dialect.now()
    for name, n in sorted(per_key.items()):
        # The slots this transaction locked are the free ones it may stamp: read them
        # again (locked rows are ours, so SKIP LOCKED skips only others') and stamp n.
        chosen = (
            select(slots.c.slot)
            .where(
                slots.c.worker == worker.name,
                slots.c.rate_key == name,
                slots.c.used_at <= now - rate.seconds,
            )
            .order_by(slots.c.slot)
            .limit(n)
            .with_for_update(skip_locked=True)
        )
        numbers = list(conn.execute(chosen).scalars())
        if len(numbers) < n:  # pragma: no cover - the slots were locked above
            raise RuntimeError(f"rate slots of {worker.name!r} vanished under a claim")
        conn.execute(
            update(slots)
            .where(
                slots.c.worker == worker.name,
                slots.c.rate_key == name,
                slots.c.slot.in_(numbers),
            )
            .values(used_at=now)
        )


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
        conn.execute(statement, {"ids": [p.source_id for p in picks]})
        return {p.source_id for p in picks}
    statement = dialect._built_once(
        ("keyed claim", table, lease_seconds, owner),
        lambda: _keyed_update(dialect, table, lease_seconds, owner),
    )
    # In key order: two claims that write the same keys wait for each other in one
    # order, never in a cycle (a deadlock).
    params = [
        {_ID_PARAM: p.source_id, KEY_PARAM: p.key}
        for p in sorted(picks, key=lambda p: (p.key is None, p.key or ""))
    ]
    if not dialect.supports_concurrent_claims:
        # One claimer at a time (SQLite's write lock): the search saw every holder.
        conn.execute(statement, params)
        return {p.source_id for p in picks}
    try:
        _in_savepoint(conn, lambda: conn.execute(statement, params))
        return {p.source_id for p in picks}
    except IntegrityError:
        log.debug("claim of worker=%s met a key just taken; claiming row by row", worker.name)
    claimed: set[Any] = set()
    for one in params:
        try:
            _in_savepoint(conn, lambda one=one: conn.execute(statement, one))  # type: ignore[misc]
            claimed.add(one[_ID_PARAM])
        except IntegrityError:
            log.debug(
                "key %r of worker=%s is held by another coordinator's claim; it waits",
                one[KEY_PARAM],
                worker.name,
            )
    return claimed


def _in_savepoint(conn: Connection, run: Callable[[], T]) -> T:
    # A savepoint: PostgreSQL aborts the whole transaction on an error otherwise, and
    # the slots and rows this claim locked must survive a conflict on one key.
    with conn.begin_nested():
        return run()


def _keyed_update(dialect: Claiming, table: Table, lease_seconds: float, owner: Owner) -> Any:
    """The claim UPDATE of one record, with its key (``KEY_PARAM``) for ``held_key``."""
    return (
        update(table)
        .where(table.c.source_id == bindparam(_ID_PARAM))
        .ordered_values(*dialect._claim_values(table, lease_seconds, owner))
    )
