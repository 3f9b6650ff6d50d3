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
them (never more than N; a short key's slots at least double), so a limit far above
the rate reached costs about twice the rows that rate uses in a window.

Keys are stored as ``stored_key`` makes them (the key's text, or a fixed-length digest
of a text too long for the column), computed in SQL so that the search's test of busy
keys compares like with like.

Every statement is built once per worker and eligible-query shape (``reuse``); the
search returns the records with their keys, read through the source's primary key.
On PostgreSQL an ``exclusive_by`` claim is one statement (``keyed_claim``), and a rated
one locks, claims and stamps in one after its search (``rate_claim``); on SQLite a
rated claim claims and then stamps (``rate_alone``), where it can. An unlimited
worker never comes here: its claim is the dialect's own, unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
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
    case,
    exists,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.visitors import replacement_traverse

from ..core.errors import ClaimContention
from ..core.status import Phase
from .claim_values import KEY_PARAM
from .keyed_claim import claim_keyed, keyed_at_once
from .limit_keys import is_busy, lookup, stored
from .rate_alone import claim_rated_alone, rated_alone
from .rate_claim import claim_rated, claim_searched
from .rate_slots import Pick, stamp_claimed, stamp_params, stamp_slots, within_rate
from .terms import Claim, Claims, Limits, Owner, WorkerTable, keyed_rows

if TYPE_CHECKING:
    from .base import Dialect
    from .claiming import Claiming

log = logging.getLogger("dbworker")

#: Search rounds per claim: each reads past the keys earlier rounds took.
SEARCH_ROUNDS = 4
_ID_PARAM = "dbworker_id"
_WINDOW = "dbworker_window"
_SEEN = "dbworker_seen"
_TAKEN = "dbworker_taken"
_CLAIM_WIDTH = 6  # len(claim_columns(table))


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
    if keyed_at_once(dialect, worker, limits, eligible):
        search = functools.partial(_search_select, dialect, worker, limits, eligible, False)
        claim = functools.partial(_lock_and_claim, dialect, worker, limits, lease_seconds, owner)
        key = ("keyed claim", worker.table, lease_seconds, owner)
        return claim_keyed(dialect, conn, worker, eligible, limit, search, claim, key, _WINDOW)
    if limits.rate is not None and (
        dialect.supports_stamp_in_claim or rated_alone(dialect, conn, worker, eligible)
    ):
        got = _claim_rated(dialect, conn, worker, limits, eligible, limit, lease_seconds, owner)
        if got is not None:
            return got
    picks = _search(dialect, conn, worker, limits, eligible, limit)
    if limits.rate is not None and picks:
        picks = within_rate(dialect, conn, worker, limits, picks)
    if not picks:
        return Claims()
    if dialect.supports_one_statement_claims:
        # PostgreSQL: its advisory key guard means no UPDATE waits on a key: one statement.
        return _claim_at_once(dialect, conn, worker, limits, picks, lease_seconds, owner)
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
        stamp_slots(dialect, conn, worker, limits, picks)
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
) -> list[Pick]:
    """Claimable rows in the eligible order with their keys, at most one per exclusive
    key and none of a key held, up to ``limit`` (unlocked: the lock comes after)."""
    picks: list[Pick] = []
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
        # On the driver's cursor where it has a form (a later round's lists need
        # SQLAlchemy): its execution around the search was 0.15-0.25 ms of a MariaDB
        # exclusive_by claim of 32 (median of ~4 ms).
        rows: Sequence[Any] = dialect._rows_of(conn, statement, statement, params)
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
            picks.append(Pick(Claim(*row[:_CLAIM_WIDTH]), held, rated))
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
        return _search_select(dialect, worker, limits, eligible, later), _WINDOW

    from .open_first import reuse  # open_first imports base, which imports this module

    key = ("limited search", worker.table, later)
    return reuse(typing_cast("Dialect", dialect), key, eligible, 0, build)


def _search_select(
    dialect: Claiming, worker: WorkerTable, limits: Limits, eligible: Select[Any], later: bool
) -> Select[Any]:
    """The search: the claim columns, then the exclusive key and the rate key (each if
    the worker has it), LIMIT ``_WINDOW``."""
    pk = worker.source_pk
    key = stored(dialect, limits.exclusive_key)
    query = eligible if key is None else eligible.where(~is_busy(worker, key))
    if later:
        query = query.where(pk.not_in(bindparam(_SEEN, expanding=True)))
        if key is not None:
            # A NULL key is nobody's: NOT IN would drop it.
            taken = key.not_in(bindparam(_TAKEN, expanding=True))
            query = query.where(or_(key.is_(None), taken))
    window = bindparam(_WINDOW, 1, type_=Integer())
    search = dialect.candidates(worker, query, typing_cast(int, window), dialect.now())
    keys = [stored(dialect, e) for e in (limits.exclusive_key, limits.rate_key)]
    lookups = [
        lookup(worker, search, k, f"dbworker_key_source_{i}")
        for i, k in enumerate(keys)
        if k is not None
    ]
    return dialect._plan_search(search.add_columns(*lookups))


def _claim_at_once(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    limits: Limits,
    picks: list[Pick],
    lease_seconds: float,
    owner: Owner,
) -> Claims:
    """Lock, guard and claim ``picks`` in one statement (where
    ``supports_one_statement_claims``), which also stamps their slots where
    ``supports_stamp_in_claim`` (PostgreSQL; else they are stamped after it). The row
    lock skips rows other claims hold and keys another claim's advisory guard holds
    (``key_guard``), so no claim waits on held_key's unique index for another's
    uncommitted claim: the one UPDATE needs no key order. A key taken by a claim that
    committed since the search still fails at the unique index: ``ClaimContention``,
    as in ``_update``."""
    table = worker.table
    statement = dialect._built_once(
        ("limited claim", table, lease_seconds, owner),
        lambda: _lock_and_claim(dialect, worker, limits, lease_seconds, owner),
    )
    params: dict[str, Any] = {"ids": [p.claim.source_id for p in picks]}
    stamped = limits.rate is not None and dialect.supports_stamp_in_claim
    if stamped:
        params.update(stamp_params(worker, picks))
    rows = keyed_rows(conn, statement, params, worker.name)
    got = {row[0]: row for row in rows}
    kept = [p for p in picks if p.claim.source_id in got]
    if limits.rate is not None and not stamped:
        stamp_slots(dialect, conn, worker, limits, kept)
    from .open_first import claimed  # open_first imports base, which imports this module

    return Claims.of(claimed(got[p.claim.source_id] for p in kept), len(picks) - len(kept))


def _claim_rated(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    limits: Limits,
    eligible: Select[Any],
    limit: int,
    lease_seconds: float,
    owner: Owner,
) -> Claims | None:
    """A rated claim whose slots are locked and stamped by its claim's statement
    (``rate_claim``), its search too where it can order the search's rows; picks of a
    key short of slots go the long way, which makes them. Where one claimer runs at a
    time (``rate_alone``) it claims, then stamps; None: a key was short of slots,
    nothing changed, and the claim takes the long way."""
    from .open_first import order_terms  # open_first imports base, which imports this module

    unrated = dataclasses.replace(limits, rate=None)
    key = ("rated claim", worker.table, lease_seconds, owner)
    claim = functools.partial(_lock_and_claim, dialect, worker, unrated, lease_seconds, owner)
    search = functools.partial(_search_select, dialect, worker, limits, eligible, False)
    if not dialect.supports_stamp_in_claim:
        return claim_rated_alone(
            dialect, conn, worker, limits, eligible, limit, search, claim, key, _WINDOW
        )
    if order_terms(eligible) is not None:
        got = claim_searched(
            dialect, conn, worker, limits, eligible, limit, search, claim, key, _WINDOW
        )
    else:
        picks = _search(dialect, conn, worker, limits, eligible, limit)
        got = (
            claim_rated(dialect, conn, worker, limits, picks, claim, key) if picks else ([], [], 0)
        )
    claims, short, skipped = got
    more = within_rate(dialect, conn, worker, limits, short) if short else []
    if more:
        late = _claim_at_once(dialect, conn, worker, limits, more, lease_seconds, owner)
        claims, skipped = [*claims, *late], skipped + late.skipped
    return Claims.of(claims, skipped)


def _lock_and_claim(
    dialect: Claiming, worker: WorkerTable, limits: Limits, lease_seconds: float, owner: Owner
) -> Any:
    """UPDATE ... WHERE source_id IN (the row lock of ``ids``, with its key guard)
    RETURNING the claim; ``held_key`` is the source row's stored key, read in SQL."""
    table = worker.table
    lock = _row_lock(dialect, worker, limits).with_only_columns(table.c.source_id)
    values = dialect._claim_values(table, lease_seconds, owner)
    key = stored(dialect, limits.exclusive_key)
    if key is not None:
        held = lookup(worker, select(table.c.source_id), key, "dbworker_key_held")
        values = [(column, _with_key(value, held)) for column, value in values]
    if key is not None and dialect.supports_concurrent_claims:
        # Read again as the rows are locked: a claim that held a key when the search
        # ran (its advisory lock) and committed since is seen now, and its key skipped,
        # where it would meet the unique index and lose the whole claim. (Where one
        # claimer runs at a time, its search saw every holder: no claim ran since.)
        holder = table.alias("dbworker_holder")
        current = lookup(worker, lock, key, "dbworker_key_busy").correlate(table)
        lock = lock.where(
            ~exists().where(holder.c.held_key == current, holder.c.source_id != table.c.source_id)
        )
    c = table.c
    claim = (
        update(table)
        .where(c.source_id.in_(lock.scalar_subquery()))
        .ordered_values(*values)
        .returning(c.source_id, c.token, c.attempts, c.failures, c.crashes)
    )
    if limits.rate is None or not dialect.supports_stamp_in_claim:
        return claim
    # The slots of the rows claimed are stamped by the same statement.
    claimed = claim.cte("dbworker_claimed")
    return select(*claimed.c).add_cte(stamp_claimed(dialect, worker, limits, claimed))


def _with_key(value: Any, held: ColumnElement[Any]) -> Any:
    """``value`` with ``held`` in place of the claim values' per-record key parameter."""
    if not isinstance(value, ColumnElement):
        return value  # a plain value (the owner's host or pid)

    def replace(element: Any, **_kw: Any) -> Any:
        return held if isinstance(element, BindParameter) and element.key == KEY_PARAM else None

    return replacement_traverse(value, {}, replace)


def _row_lock(dialect: Claiming, worker: WorkerTable, limits: Limits) -> Any:
    """The dialect's lock of the records ``ids``, with its ``key_guard`` if it has one."""
    lock = dialect._row_lock(worker.table)
    key = stored(dialect, limits.exclusive_key)
    if key is None:
        return lock
    guard = dialect.key_guard(worker.name, lookup(worker, lock, key, "dbworker_key_source"))
    return lock if guard is None else lock.where(guard)


def _update(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    limits: Limits,
    picks: list[Pick],
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
    batch = None
    if len(params) > 1:
        # One statement for the batch (a round trip a record less), its rows written in
        # key order as the loop below writes them (None: the order cannot be told); a key
        # another claim took since the search fails it whole, then one by one.
        batch = dialect._built_once(
            ("keyed batch", table, lease_seconds, owner, len(params)),
            lambda: _keyed_batch(dialect, table, lease_seconds, owner, len(params)),
        )
    if batch is not None:
        flat = {f"{k}_{i}": v for i, one in enumerate(params) for k, v in one.items()}
        try:
            conn.execute(batch, flat)
            return {one[_ID_PARAM] for one in params}
        except IntegrityError:
            log.debug("a key of worker=%s was just taken; claiming one by one", worker.name)
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


def _keyed_batch(
    dialect: Claiming, table: Table, lease_seconds: float, owner: Owner, count: int
) -> Any:
    """The claim UPDATE of ``count`` records given in key order (``_ID_PARAM``_i with
    ``KEY_PARAM``_i), each with its key, written in that order (``update_in_order``)."""
    ids: list[BindParameter[Any]] = [bindparam(f"{_ID_PARAM}_{i}") for i in range(count)]
    key = case(
        *[
            (table.c.source_id == ids[i], bindparam(f"{KEY_PARAM}_{i}", type_=String()))
            for i in range(count)
        ]
    )
    rank = case(*[(table.c.source_id == ids[i], i) for i in range(count)])
    values = [(c, _with_key(v, key)) for c, v in dialect._claim_values(table, lease_seconds, owner)]
    statement = update(table).where(table.c.source_id.in_(ids)).ordered_values(*values)
    return dialect.update_in_order(statement, rank)
