"""A rated claim where one claimer runs at a time (SQLite, under its write lock; issue
26, see ``limited.py`` and ``rate_slots.py``): claim first, then stamp, in two
statements where the long way takes four (search, slot lock, claim, stamp).

1. The claim's UPDATE, whose WHERE holds the limited search (up to the limit; the
   first row of each exclusive key, if the worker has one), RETURNING each claimed
   record with its rate key. Nobody else claims between the search and the UPDATE, so
   the rows searched are the rows claimed, as in ``keyed_claim``.
2. An UPDATE of the slots that stamps, for each rate key, as many free slots as the
   claim took records of that key, RETURNING the slots it stamped. A key's slots are
   used round in order, so its free ones are read from the slot after the one last
   stamped here; a key that ran off its last slot reads on from slot 0, and one with
   too few slots gets new ones (``make_slots``, up to its rate's N).

Both run inside a savepoint. If a key still got fewer slots than it claimed records
(its limit is being hit), the savepoint is rolled back, so that nothing of this
attempt remains, and the caller takes the long way, which claims no more than the
slots allow. After that the worker takes the long way for ``SHORT_BACKOFF_SECONDS``:
a limit that is being hit would otherwise pay for two claims each time.

RETURNING comes back in no order; in the source key's order (the only order this path
takes) the key alone puts the claims back in order. A claim of 10, timed around
``claim`` with 16 rate keys: 0.29 / 0.38 ms (rate_limit / rate_limit_by) this way,
0.72 / 0.70 the long way, 0.16 without limits.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from typing import cast as typing_cast

from sqlalchemy import (
    Connection,
    Select,
    String,
    literal,
    literal_column,
    select,
    union_all,
    update,
)
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.visitors import replacement_traverse

from .driver_cursor import run_plain
from .rate_claim import LISTED_LIMIT, listed_picks
from .rate_slots import WORKER_WIDE, free_from, free_params, key_starts, make_slots, note_last
from .terms import Claims, Limits, WorkerTable

if TYPE_CHECKING:
    from .base import Dialect
    from .claiming import Claiming

#: After a key came up short, the worker's claims take the long way for this long.
SHORT_BACKOFF_SECONDS = 1.0
_SAVEPOINT = "dbworker_rated"


def rated_alone(dialect: Claiming, conn: Connection, worker: WorkerTable, eligible: Any) -> bool:
    """Whether a rated claim of ``worker`` may try this path now: one claimer at a time,
    an UPDATE that returns its rows, the source key's order, and no key of the worker
    short a moment ago."""
    from .open_first import key_direction  # open_first imports base: a cycle

    return (
        not dialect.supports_concurrent_claims
        and dialect.supports_one_statement_claims
        and conn.dialect.update_returning
        and key_direction(eligible, worker) is not None
        and dialect._rate_state.short_until.get(worker.name, 0.0) <= _now(dialect)
    )


def _now(dialect: Claiming) -> float:
    """The time, on the test clock if the dialect has one (so that a test that moves
    it on sees this path again)."""
    return time.monotonic() if dialect.clock is None else dialect.clock()


def claim_rated_alone(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    limits: Limits,
    eligible: Select[Any],
    limit: int,
    search: Callable[[], Select[Any]],
    claim: Callable[[], Any],
    key: tuple[Any, ...],
    window: str,
) -> Claims | None:
    """Claim up to ``limit`` records and stamp their slots; None, with nothing changed,
    when a key is short of free slots. ``search()`` is the limited search (LIMIT bound
    as ``window``), ``claim()`` the unrated claim UPDATE of the records ``ids``."""
    from .open_first import claimed, key_direction, reuse  # open_first imports base

    def build() -> tuple[Any, str]:
        return _claim_update(dialect, worker, limits, search, claim()), window

    statement, params = reuse(typing_cast("Dialect", dialect), key, eligible, 0, build)
    # Without an exclusive key, no row the search finds is skipped: it reads ``limit``.
    params[window] = 2 * limit + 8 if limits.keyed else limit
    params[LISTED_LIMIT] = limit
    params.update(dialect._plan_params(conn))
    # An error on the way loses the whole claim's transaction, savepoint and all.
    run_plain(conn, f"SAVEPOINT {_SAVEPOINT}")
    # SQLAlchemy's execution, around this statement, was a third of the claim's time.
    rows = dialect._rows_of(conn, statement, statement, params)
    wanted = Counter(str(row[5]) for row in rows if row[5] is not None)
    if wanted and not _stamp(dialect, conn, worker, limits, wanted):
        run_plain(conn, f"ROLLBACK TO {_SAVEPOINT}")
        run_plain(conn, f"RELEASE {_SAVEPOINT}")
        dialect._rate_state.short_until[worker.name] = _now(dialect) + SHORT_BACKOFF_SECONDS
        return None
    run_plain(conn, f"RELEASE {_SAVEPOINT}")
    claims = claimed(row[:5] for row in rows)
    claims.sort(key=lambda c: c.source_id, reverse=key_direction(eligible, worker) == "desc")
    return Claims.of(claims)


def _claim_update(
    dialect: Claiming,
    worker: WorkerTable,
    limits: Limits,
    search: Callable[[], Select[Any]],
    claim: Any,
) -> Any:
    """``claim`` of the records the limited search finds, RETURNING each one's rate key
    after its claim columns. Without an exclusive key the search is the LIMIT itself;
    with one, ``listed_picks`` takes the first of each key. (In a CTE the search is not
    correlated with the UPDATE's own table.)"""
    table = worker.table
    if limits.keyed:
        picks = listed_picks(limits, search())
    else:
        found = search()
        rate = list(found.selected_columns)[-1] if limits.rate_key is not None else None
        picks = found.with_only_columns(
            found.selected_columns[0].label("id"),
            (literal(WORKER_WIDE, String()) if rate is None else rate).label("rate_key"),
        )
    picked = picks.cte("dbworker_picked").prefix_with("MATERIALIZED")

    def replace(element: Any, **_kw: Any) -> Any:
        if isinstance(element, BindParameter) and element.key == "ids":
            return select(picked.c.id).scalar_subquery()
        return None

    # SQLAlchemy writes RETURNING's columns unqualified, so the lookup's columns must
    # not share a name with the execution table's (``id`` and ``rate_key`` do not): a
    # lookup in the source table would see a source column named ``source_id``.
    rated = (
        select(picked.c.rate_key)
        .where(picked.c.id == table.c.source_id)
        .scalar_subquery()
        .correlate(table)
    )
    return replacement_traverse(claim, {}, replace).returning(rated)


def _stamp(
    dialect: Claiming, conn: Connection, worker: WorkerTable, limits: Limits, wanted: Counter[str]
) -> bool:
    """Stamp ``wanted[key]`` free slots of each key, read from the slot after the one
    this process last stamped (``key_starts``), then, for keys that ran off their last
    slot, round from slot 0; whether every key got all."""
    starts = key_starts(dialect, worker, wanted)
    got = _stamp_from(dialect, conn, worker, limits, wanted, starts, after=True)
    short = {name: n - got[name] for name, n in wanted.items() if got[name] < n}
    if short:
        again = _stamp_from(dialect, conn, worker, limits, short, starts, after=False)
        short = {name: n - again[name] for name, n in short.items() if again[name] < n}
    if short:
        # Too few slots: make a key's missing ones (up to its rate's N), and read them;
        # a key whose N are all used within the window stays short.
        if not make_slots(dialect, conn, worker, limits, short):
            return False
        again = _stamp_from(dialect, conn, worker, limits, short, dict.fromkeys(short, 0), True)
        return all(again[name] >= n for name, n in short.items())
    return True


def _stamp_from(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    limits: Limits,
    wanted: dict[str, int],
    starts: dict[str, int],
    after: bool,
) -> Counter[str]:
    """Stamp up to ``wanted[key]`` free slots of each key, the first ones from
    ``starts[key]`` on (``after``) or before it; how many each key got."""
    assert limits.slots is not None
    slots, names = limits.slots, sorted(wanted)
    # Parts for a power of two of keys, the spare ones with LIMIT 0: a handful of shapes
    # to compile (each a few milliseconds), not one per number of keys.
    width = 1 << (len(names) - 1).bit_length()

    def part(i: int) -> Any:
        return free_from(dialect, limits, i, after, literal_column("rowid"))

    def build() -> Any:
        # Each part in a derived table: SQLite refuses ORDER BY and LIMIT inside UNION.
        parts = [part(i).subquery(f"dbworker_part_{i}") for i in range(width)]
        ids = union_all(*[select(*p.c) for p in parts]) if len(parts) > 1 else select(*parts[0].c)
        return (
            update(slots)
            .where(literal_column("rowid").in_(ids))
            .values(used_at=dialect.now())
            .returning(slots.c.rate_key, slots.c.slot)
        )

    built_as = ("alone stamp", worker.table, width, after)
    statement = dialect._built_once(built_as, build)
    params = free_params(worker, wanted, starts, width)
    rows = dialect._rows_of(conn, built_as, statement, params)
    stamped: dict[str, list[int]] = {}
    for name, slot in rows:
        stamped.setdefault(str(name), []).append(int(slot))
    for name, used in stamped.items():
        note_last(dialect, worker, name, max(used))
    return Counter({name: len(used) for name, used in stamped.items()})
