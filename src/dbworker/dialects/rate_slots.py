"""A rate limit's slots (issue 26; see ``limited.py``): at most N rows per (worker,
key), each the database time it was last used. A claim locks free slots (FOR UPDATE SKIP
LOCKED where the database has row locks), makes a key's slots as claims need them, and
stamps the slots of the rows it claimed in its own transaction."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    Connection,
    Integer,
    Select,
    String,
    Table,
    and_,
    bindparam,
    cast,
    func,
    or_,
    select,
    union_all,
    update,
)

from .driver_cursor import rowcount
from .terms import Claim, Limits, WorkerTable

if TYPE_CHECKING:
    from .claiming import Claiming

#: The rate_key of a worker-wide rate limit's slots.
WORKER_WIDE = ""
_WORKER = "dbworker_worker"
_RATE_KEYS = "dbworker_rate_keys"
_WANTED = "dbworker_wanted"
_RATE_KEY = "dbworker_rate_key"
_SLOT = "dbworker_slot"
_START = "dbworker_start"
_PICK_IDS = "dbworker_pick_ids"
_PICK_KEYS = "dbworker_pick_keys"
_PICK_SLOTS = "dbworker_pick_slots"


@dataclasses.dataclass(slots=True)
class Pick:
    """A record a limited claim found, with its keys and, once got, its rate slot."""

    claim: Claim
    key: str | None
    rate_key: str | None
    slot: int | None = None


def within_rate(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, picks: list[Pick]
) -> list[Pick]:
    """The picks, in order, for which a rate slot is free, each with its slot (locked
    until the claim ends)."""
    wanted: dict[str, int] = {}
    for pick in picks:
        if limits.rate_key is None or pick.rate_key is not None:
            name = WORKER_WIDE if limits.rate_key is None else str(pick.rate_key)
            wanted[name] = wanted.get(name, 0) + 1
    free = free_slots(dialect, conn, worker, limits, wanted)
    kept: list[Pick] = []
    for pick in picks:
        if limits.rate_key is not None and pick.rate_key is None:
            kept.append(pick)  # a NULL key is limited by nothing
            continue
        name = WORKER_WIDE if limits.rate_key is None else str(pick.rate_key)
        if free.get(name):
            kept.append(dataclasses.replace(pick, rate_key=name, slot=free[name].pop()))
    return kept


def free_slots(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, wanted: dict[str, int]
) -> dict[str, list[int]]:
    """The free slot numbers each key got (locked until the claim ends), making a key's
    slots as they are needed, up to its rate's N."""
    got = _lock_slots(dialect, conn, worker, limits, wanted)
    short = sorted(k for k, n in wanted.items() if len(got.get(k, ())) < n)
    if not short:
        return got
    make_slots(dialect, conn, worker, limits, {k: wanted[k] - len(got.get(k, ())) for k in short})
    # Rows this transaction locked or made are its own: SKIP LOCKED skips only others'.
    got.update(_lock_slots(dialect, conn, worker, limits, {k: wanted[k] for k in short}))
    return got


def make_slots(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, short: dict[str, int]
) -> bool:
    """Make new free slots for keys ``short[key]`` slots short, up to each one's N;
    whether any were made."""
    assert limits.slots is not None and limits.rate is not None
    slots, count = limits.slots, limits.rate.count
    made = dialect._built_once(("slot count", worker.table), lambda: _slot_count(slots))
    keys = sorted(short)
    existing = {k: int(n) for k, n in conn.execute(made, {_WORKER: worker.name, _RATE_KEYS: keys})}
    # A short key's slots at least double (up to N): a rate that climbs pays for a few
    # makes (each a transaction of its own and a second lock), not one every claim.
    values = [
        {"worker": worker.name, "rate_key": k, "slot": n, "used_at": 0.0}
        for k in keys
        for n in _new_slots(existing.get(k, 0), short[k], count)
    ]
    if values:
        _make_slots(dialect, conn, slots, values)
    return bool(values)


def _new_slots(have: int, short_by: int, count: int) -> range:
    """The numbers of a key's new slots: at least ``short_by`` more, at least double
    the ``have`` it has, never beyond its rate's ``count``."""
    return range(have, min(count, max(2 * have, have + short_by)))


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
    """Lock up to ``wanted[key]`` free slots of each key, read from the one after the
    slot last stamped here (``key_starts``), then, for keys that ran off their last slot,
    round from slot 0. Read from slot 0 every time, a claim passed all the slots used
    within the window, which lie together (about 0.4 ms of a claim of 16 keys on SQLite,
    under the write lock; on MySQL a row lock taken and let go for each slot passed).
    Other coordinators' stamps are not in ``key_starts``: a start they moved past still
    finds the free slots after it, or round from slot 0. (PostgreSQL's one-statement
    claim starts at random and notes nothing here: its long way reads from slot 0.)"""
    if dialect.supports_stamp_in_claim:
        starts = dict.fromkeys(wanted, 0)
    else:
        starts = key_starts(dialect, worker, wanted)
    got = _lock_from(dialect, conn, worker, limits, wanted, starts, after=True)
    short = {
        name: n - len(got.get(name, ()))
        for name, n in wanted.items()
        if starts[name] > 0 and len(got.get(name, ())) < n
    }
    if short:
        for name, more in _lock_from(dialect, conn, worker, limits, short, starts, False).items():
            got.setdefault(name, []).extend(more)
    for name, taken in got.items():
        note_last(dialect, worker, name, taken[-1])  # in the order they were read
    return got


def _lock_from(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    limits: Limits,
    wanted: dict[str, int],
    starts: dict[str, int],
    after: bool,
) -> dict[str, list[int]]:
    """Lock up to ``wanted[key]`` free slots of each key, the first from ``starts[key]``
    on (``after``) or before it: a part per key, each with its own LIMIT (one search over
    all the keys would lock every free slot of each, rows other coordinators' claims
    then skip, and read them all). Each key's slots, in order."""
    assert limits.slots is not None and limits.rate is not None
    slots = limits.slots
    count = len(wanted)

    def part(i: int) -> Any:
        # SKIP LOCKED: another coordinator's claim holds those slots until it ends.
        # (SQLAlchemy drops FOR UPDATE on SQLite, whose claim holds the write lock.)
        found = free_from(dialect, limits, i, after, slots.c.rate_key, slots.c.slot)
        return found.with_for_update(skip_locked=True)

    def build() -> Any:
        if count == 1:
            return part(0)
        # Each part in a derived table: PostgreSQL refuses FOR UPDATE beside UNION.
        parts = [part(i).subquery(f"dbworker_slots_{i}") for i in range(count)]
        return union_all(*[select(*p.c) for p in parts])

    built_as = ("slot lock", worker.table, count, after)
    statement = dialect._built_once(built_as, build)
    params = free_params(worker, wanted, starts, count)
    got: dict[str, list[int]] = {}
    for name, slot in dialect._rows_of(conn, built_as, statement, params):
        got.setdefault(str(name), []).append(int(slot))
    for taken in got.values():
        taken.sort()  # a UNION keeps no order
    return got


def free_from(dialect: Claiming, limits: Limits, i: int, after: bool, *columns: Any) -> Select[Any]:
    """``columns`` of the ``i``-th key's free slots (in a statement of a part per key,
    bound by ``free_params``), in slot order, the first from its start on (``after``)
    or before it, up to the number it wants."""
    assert limits.slots is not None and limits.rate is not None
    slots, seconds = limits.slots, limits.rate.seconds
    start = bindparam(f"{_START}_{i}", type_=Integer())
    return (
        select(*columns)
        .where(
            slots.c.worker == bindparam(_WORKER),
            slots.c.rate_key == bindparam(f"{_RATE_KEY}_{i}"),
            slots.c.used_at <= dialect.now() - seconds,
            slots.c.slot >= start if after else slots.c.slot < start,
        )
        .order_by(slots.c.slot)
        .limit(bindparam(f"{_WANTED}_{i}", type_=Integer()))
    )


def free_params(
    worker: WorkerTable, wanted: dict[str, int], starts: dict[str, int], width: int
) -> dict[str, Any]:
    """The parameters of ``width`` ``free_from`` parts for the keys of ``wanted`` in
    sorted order; parts past the last key want none."""
    names = sorted(wanted)
    params: dict[str, Any] = {_WORKER: worker.name}
    for i in range(width):
        name = names[i] if i < len(names) else names[0]
        params[f"{_RATE_KEY}_{i}"] = name
        params[f"{_WANTED}_{i}"] = wanted[name] if i < len(names) else 0
        params[f"{_START}_{i}"] = starts[name]
    return params


class RateState:
    """What a dialect remembers of its rate slots between claims, where one claimer runs
    at a time (SQLite): the slot each (worker, key) last stamped here, after which its
    next free slots are looked for, and until when a worker's rated claims take the
    long way (``rate_alone``)."""

    __slots__ = ("last", "short_until")

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], int] = {}
        self.short_until: dict[str, float] = {}


def key_starts(dialect: Claiming, worker: WorkerTable, wanted: Any) -> dict[str, int]:
    """Where each key's search for free slots starts: after the slot this process last
    stamped. A key's slots are used round in order, so the ones after it are the least
    recently used; read from slot 0, a claim would pass every slot used within the
    window, which lie together."""
    last = dialect._rate_state.last
    return {name: last.get((worker.name, name), -1) + 1 for name in wanted}


def note_last(dialect: Claiming, worker: WorkerTable, name: str, slot: int) -> None:
    """``slot`` is the last slot of key ``name`` this process stamped."""
    dialect._rate_state.last[(worker.name, name)] = slot


def _slot_count(slots: Table) -> Any:
    return (
        select(slots.c.rate_key, func.count())
        .where(
            slots.c.worker == bindparam(_WORKER),
            slots.c.rate_key.in_(bindparam(_RATE_KEYS, expanding=True)),
        )
        .group_by(slots.c.rate_key)
    )


def stamp_slots(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, picks: list[Pick]
) -> None:
    """Stamp the slot of each claimed pick with the database's time, in one statement
    (a round trip, where an executemany is one a slot on some drivers): each slot by
    its key, an index lookup (one UPDATE of (rate_key, slot) IN (...) scanned every
    slot of the worker on SQLite)."""
    assert limits.slots is not None
    slots = limits.slots
    used = sorted((str(p.rate_key), p.slot) for p in picks if p.slot is not None)
    if not used:
        return
    keys = sorted({k for k, _ in used})
    params: dict[str, Any] = {_WORKER: worker.name}
    if len(keys) == 1:
        shape: Any = ("one key",)
        params[_RATE_KEY] = keys[0]
        params[_SLOT] = [slot for _, slot in used]
    else:
        shape = len(used)
        for i, (key, slot) in enumerate(used):
            params[f"{_RATE_KEY}_{i}"] = key
            params[f"{_SLOT}_{i}"] = slot

    def build() -> Any:
        worker_is = slots.c.worker == bindparam(_WORKER)
        if shape == ("one key",):
            which: Any = and_(
                worker_is,
                slots.c.rate_key == bindparam(_RATE_KEY),
                slots.c.slot.in_(bindparam(_SLOT, expanding=True)),
            )
        else:
            # The worker in every term, not beside the OR: SQLite then looks each slot up
            # by its whole primary key (4 ms for 34 slots scanning the worker's, 32 µs).
            which = or_(
                *[
                    and_(
                        worker_is,
                        slots.c.rate_key == bindparam(f"{_RATE_KEY}_{i}"),
                        slots.c.slot == bindparam(f"{_SLOT}_{i}"),
                    )
                    for i in range(shape)
                ]
            )
        return update(slots).where(which).values(used_at=dialect.now())

    built_as = ("slot stamp", worker.table, shape)
    statement = dialect._built_once(built_as, build)
    forms = dialect._driver_forms
    driver = None if dialect.clock is not None else forms.get(conn, built_as, statement)
    if driver is None:  # the one-key form's IN list expands at execution
        conn.execute(statement, params)
    else:
        rowcount(conn, driver, params)


def stamp_claimed(dialect: Claiming, worker: WorkerTable, limits: Limits, claimed: Any) -> Any:
    """A data-modifying CTE for a claim that is one statement (PostgreSQL): stamp the
    slots of the picks (``stamp_params``) whose records ``claimed``, the claim's own
    RETURNING as a CTE, returned; exactly the claimed ones', in the claim's statement
    (a round trip less than ``stamp_slots`` after it)."""
    assert limits.slots is not None
    slots = limits.slots
    picked = (
        func.unnest(
            cast(bindparam(_PICK_IDS), ARRAY(worker.table.c.source_id.type)),
            cast(bindparam(_PICK_KEYS), ARRAY(String())),
            cast(bindparam(_PICK_SLOTS), ARRAY(Integer())),
        )
        .table_valued("id", "rate_key", "slot")
        .render_derived(name="dbworker_picked")
    )
    return (
        update(slots)
        .where(
            slots.c.worker == bindparam(_WORKER),
            slots.c.rate_key == picked.c.rate_key,
            slots.c.slot == picked.c.slot,
            picked.c.id.in_(select(claimed.c.source_id)),
        )
        .values(used_at=dialect.now())
        .returning(slots.c.slot)
        .cte("dbworker_stamped")
    )


def stamp_params(worker: WorkerTable, picks: list[Pick]) -> dict[str, Any]:
    """The parameters of ``stamp_claimed``: each pick's record, rate key and slot."""
    rated = [p for p in picks if p.slot is not None]
    return {
        _WORKER: worker.name,
        _PICK_IDS: [p.claim.source_id for p in rated],
        _PICK_KEYS: [str(p.rate_key) for p in rated],
        _PICK_SLOTS: [p.slot for p in rated],
    }
