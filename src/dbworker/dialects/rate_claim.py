"""A rate-limited claim in one statement, where ``supports_stamp_in_claim`` (PostgreSQL;
issue 26, see ``limited.py`` and ``rate_slots.py``).

The picks of the search go in as arrays. The statement locks up to as many free slots
of each rate key as it has picks (FOR UPDATE SKIP LOCKED in a LATERAL subquery, a
LIMIT per key), claims each key's first picks, as many as it locked slots (and those
of a NULL key, which nothing limits), and stamps every slot it locked: a round trip
where locking the slots first took two. Its rows say, for each pick, whether it had a
slot, and the claim, if any. A pick of a key that got too few slots goes the long way
(``within_rate``, which makes a key's missing slots), so that a climbing rate still
grows its slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from typing import cast as typing_cast

from sqlalchemy import (
    ARRAY,
    Connection,
    Integer,
    Select,
    String,
    any_,
    bindparam,
    case,
    cast,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.sql.elements import BinaryExpression, BindParameter
from sqlalchemy.sql.visitors import replacement_traverse
from sqlalchemy.types import UserDefinedType

from ..core.errors import ClaimContention
from ..core.status import Phase
from .rate_slots import WORKER_WIDE, Pick
from .terms import Claim, Limits, WorkerTable, keyed_rows

if TYPE_CHECKING:
    from .base import Dialect
    from .claiming import Claiming

_IDS = "dbworker_rated_ids"
#: The bound name of ``listed_picks``' LIMIT.
LISTED_LIMIT = "dbworker_rated_limit"
_CLAIM_WIDTH = 6  # len(claim_columns(table))
_WORKING = Phase.WORKING.value
#: Slots a key needs before its search for free ones starts at random.
_SPREAD_FROM = 64
_KEYS = "dbworker_rated_keys"
_WORKER = "dbworker_rated_worker"


class _Tid(UserDefinedType[Any]):
    """PostgreSQL's row address (``ctid``)."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "TID"


def claim_rated(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    limits: Limits,
    picks: list[Pick],
    claim: Callable[[], Any],
    key: tuple[Any, ...],
) -> tuple[list[Claim], list[Pick], int]:
    """Claim ``picks`` within the rate in one statement, ``claim`` being the claim's
    UPDATE ... RETURNING of the records ``ids`` (built, once, under ``key``). Returns the
    claims in pick order, the picks that got no slot (for the long way), and how many
    picks that got a slot were skipped (locked or taken by another claim)."""
    statement = dialect._built_once(key, lambda: _statement(dialect, worker, limits, claim()))
    keys = [
        WORKER_WIDE if limits.rate_key is None else p.rate_key and str(p.rate_key) for p in picks
    ]
    params = {_IDS: [p.claim.source_id for p in picks], _KEYS: keys, _WORKER: worker.name}
    rows = keyed_rows(conn, statement, params, worker.name)
    _check_stamped(rows, worker.name)
    by_id = {row[0]: row for row in rows}
    claims: list[Claim] = []
    short: list[Pick] = []
    skipped = 0
    working = Phase.WORKING.value
    for pick, rate_key in zip(picks, keys, strict=True):
        source_id, slot, token, attempts, failures, crashes, _ = by_id[pick.claim.source_id]
        if token is not None:
            claims.append(Claim(source_id, token, attempts, failures, crashes, working))
        elif rate_key is not None and not slot:
            short.append(pick)
        else:
            skipped += 1
    return claims, short, skipped


def claim_searched(
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
) -> tuple[list[Claim], list[Pick], int]:
    """``claim_rated`` with the search in the same statement (its round trip saved):
    ``search()`` is the limited search (LIMIT bound as ``window``); the first row of
    each exclusive key (if the worker has one) in its order, up to ``limit``, are the
    picks. Built once per eligible-query shape under ``key``."""
    from .open_first import reuse  # open_first imports base, which imports us

    def build() -> tuple[Any, str]:
        return _statement(dialect, worker, limits, claim(), listed_picks(limits, search())), window

    statement, params = reuse(typing_cast("Dialect", dialect), key, eligible, 0, build)
    # Without an exclusive key, no row the search finds is skipped: it reads ``limit``.
    window_rows = 2 * limit + 8 if limits.keyed else limit
    params.update({window: window_rows, LISTED_LIMIT: limit, _WORKER: worker.name})
    params.update(dialect._plan_params(conn))
    # On the driver's cursor: SQLAlchemy's execution around it cost 0.1-0.2 ms a claim.
    rows = keyed_rows(conn, statement, params, worker.name, dialect._rows_of)
    _check_stamped(rows, worker.name)
    claims: list[Claim] = []
    short: list[Pick] = []
    skipped = 0
    for source_id, slot, token, attempts, failures, crashes, _, *found in rows:
        if token is not None:
            claims.append(Claim(source_id, token, attempts, failures, crashes, _WORKING))
            continue
        extra = iter(found[_CLAIM_WIDTH:])
        held = next(extra) if limits.keyed else None
        rated = next(extra) if limits.rate_key is not None else WORKER_WIDE
        if rated is not None and not slot:
            short.append(Pick(Claim(*found[:_CLAIM_WIDTH]), held, rated))
        else:
            skipped += 1
    return claims, short, skipped


def listed_picks(limits: Limits, search: Select[Any]) -> Select[Any]:
    """The picks of ``search``: (id, rate_key, ord, then the search's own columns), the
    first row of each exclusive key in the search's order, up to ``LISTED_LIMIT``."""
    from .open_first import apply_modifiers, order_terms

    terms = order_terms(search)
    if terms is None:
        raise TypeError("a one-statement rated claim needs a search it can order by")
    labels = [element.label(f"dbworker_order_{i}") for i, (element, _) in enumerate(terms)]
    found = search.add_columns(*labels).cte("dbworker_found").prefix_with("MATERIALIZED")
    width = _CLAIM_WIDTH + limits.keyed + (limits.rate_key is not None)
    columns = list(found.c)[:width]

    def order(table: Any) -> list[Any]:
        return [
            apply_modifiers(table.c[f"dbworker_order_{i}"], modifiers)
            for i, (_, modifiers) in enumerate(terms)
        ]

    source: Any = found
    first: Any = true()
    if limits.keyed:
        held = columns[_CLAIM_WIDTH]
        nth = func.row_number().over(partition_by=held, order_by=order(found))
        source = select(*found.c, nth.label("dbworker_nth")).subquery("dbworker_ranked")
        columns = list(source.c)[:width]
        first = or_(source.c.dbworker_nth == 1, columns[_CLAIM_WIDTH].is_(None))
    rated = literal(WORKER_WIDE) if limits.rate_key is None else columns[width - 1]
    return (
        select(
            columns[0].label("id"),
            cast(rated, String()).label("rate_key"),
            func.row_number().over(order_by=order(source)).label("ord"),
            *[column.label(f"dbworker_found_{i}") for i, column in enumerate(columns)],
        )
        .where(first)
        .order_by(*order(source))
        .limit(bindparam(LISTED_LIMIT, type_=Integer()))
    )


def _statement(
    dialect: Claiming,
    worker: WorkerTable,
    limits: Limits,
    claim: Any,
    listed: Select[Any] | None = None,
) -> Any:
    """The one statement; ``listed``: the picks with their search's columns (else the
    ``_IDS`` and ``_KEYS`` arrays')."""
    assert limits.slots is not None and limits.rate is not None
    slots, seconds = limits.slots, limits.rate.seconds
    if listed is None:
        source: Any = (
            func.unnest(
                cast(bindparam(_IDS), ARRAY(worker.table.c.source_id.type)),
                cast(bindparam(_KEYS), ARRAY(String())),
            )
            .table_valued("id", "rate_key", with_ordinality="ord")
            .render_derived(name="dbworker_listed")
        )
    else:
        source = listed.subquery("dbworker_listed")
    extras = [column for column in source.c if column.key.startswith("dbworker_found_")]
    picks = select(
        source.c.id,
        source.c.rate_key,
        source.c.ord,
        *extras,
        func.row_number().over(partition_by=source.c.rate_key, order_by=source.c.ord).label("n"),
    ).cte("dbworker_picks")
    largest = (
        select(func.coalesce(func.max(slots.c.slot), -1))
        .where(slots.c.worker == bindparam(_WORKER), slots.c.rate_key == picks.c.rate_key)
        .scalar_subquery()
    )
    wanted = func.count()
    # Where a key's search for free slots starts: at random, with room for the slots it
    # wants before the last. Slots are taken in turn, so those used within the window
    # lie together: a search from slot 0 read past all of them (every claim read about
    # half the slots of a worker-wide rate). A search that finds too few sends its
    # picks the long way, which reads from slot 0.
    # A key of few slots is read from slot 0: a random start there mostly left too few
    # free slots after it, and every miss costs the long way's statements.
    spread = cast(func.floor(func.random() * func.greatest(0, largest + 2 - wanted)), Integer())
    start = case((largest < _SPREAD_FROM, 0), else_=spread)
    wants = (
        select(picks.c.rate_key, wanted.label("wanted"), start.label("start"))
        .where(picks.c.rate_key.is_not(None))
        .group_by(picks.c.rate_key)
        .cte("dbworker_wants")
    )

    # A LIMIT per key, in a LATERAL subquery: SKIP LOCKED passes slots another
    # coordinator's claim holds until it ends. Each slot's row address is kept for the
    # stamp (the row is locked: it stays where it is until this transaction ends).
    def free(source: Any, limit: Any, after: bool, name: str) -> Any:
        return (
            select(slots.c.slot, literal_column("ctid", _Tid()).label("tid"))
            .where(
                slots.c.worker == bindparam(_WORKER),
                slots.c.rate_key == source.c.rate_key,
                slots.c.slot >= source.c.start if after else slots.c.slot < source.c.start,
                slots.c.used_at <= dialect.now() - seconds,
            )
            .order_by(slots.c.slot)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .lateral(name)
        )

    after = free(wants, wants.c.wanted, True, "dbworker_free")
    got_after = (
        select(wants.c.rate_key, after.c.tid)
        .select_from(wants.join(after, true()))
        .cte("dbworker_got_after")
    )
    # Then round from slot 0 for what a key did not find after its start (without it,
    # about half the claims of a busy key found too few and went the long way).
    counted = (
        select(got_after.c.rate_key, func.count().label("found"))
        .group_by(got_after.c.rate_key)
        .subquery("dbworker_found_after")
    )
    short = (
        select(
            wants.c.rate_key,
            wants.c.start,
            (wants.c.wanted - func.coalesce(counted.c.found, 0)).label("missing"),
        )
        .select_from(wants.outerjoin(counted, counted.c.rate_key == wants.c.rate_key))
        .where(wants.c.start > 0, wants.c.wanted > func.coalesce(counted.c.found, 0))
        .cte("dbworker_short")
    )
    before = free(short, short.c.missing, False, "dbworker_free_before")
    locked = union_all(
        select(got_after.c.rate_key, got_after.c.tid),
        select(short.c.rate_key, before.c.tid).select_from(short.join(before, true())),
    ).cte("dbworker_locked")
    got = (
        select(locked.c.rate_key, func.count().label("got"))
        .group_by(locked.c.rate_key)
        .cte("dbworker_got")
    )
    # A key's first picks, as many as it locked slots, are claimed: no pick is paired
    # with a slot of its own. A pick the claim skips (another claim holds its record)
    # still spends its slot for one window: stricter, never looser, and rare.
    has_slot = picks.c.n <= func.coalesce(got.c.got, 0)
    slotted = picks.outerjoin(got, got.c.rate_key == picks.c.rate_key)
    # Each set a row lock or UPDATE reads is an array computed first (= ANY of an
    # uncorrelated subquery): an index lookup per element whatever the planner guesses
    # of a CTE's rows (a semi-join with the CTE read every open record, or every slot).
    kind = worker.table.c.source_id.type
    allowed = _any(
        select(func.array_agg(picks.c.id))
        .select_from(slotted)
        .where(or_(picks.c.rate_key.is_(None), has_slot)),
        kind,
    )

    def replace(element: Any, **_kw: Any) -> Any:
        if (
            isinstance(element, BinaryExpression)
            and isinstance(element.right, BindParameter)
            and element.right.key == "ids"
        ):
            return element.left == allowed
        return None

    claimed = replacement_traverse(claim, {}, replace).cte("dbworker_claimed")
    # The slots by their row addresses (a TID scan): by key and number, the planner,
    # blind to the CTEs' sizes, read every slot of the worker for each (34-50 ms a claim
    # at 16 keys). A slot another claim stamped after this statement's snapshot has a
    # new address the stamp cannot see; it is no longer free either, so the lock's
    # recheck drops it. Should one be missed all the same, the count below says so.
    stamped = (
        update(slots)
        .where(
            # Nothing else: with the worker beside it, the planner read all its slots.
            literal_column("ctid", _Tid()) == _any(select(func.array_agg(locked.c.tid)), _Tid())
        )
        .values(used_at=dialect.now())
        .returning(slots.c.slot)
        .cte("dbworker_stamped")
    )
    c = claimed.c
    found = [picks.c[column.key] for column in extras]
    missed = (
        select(func.count()).select_from(locked).scalar_subquery()
        - select(func.count()).select_from(stamped).scalar_subquery()
    )
    return (
        select(
            picks.c.id,
            case((picks.c.rate_key.is_not(None), has_slot)).label("dbworker_has_slot"),
            c.token,
            c.attempts,
            c.failures,
            c.crashes,
            missed.label("dbworker_missed"),
            *found,
        )
        .select_from(slotted.outerjoin(claimed, c.source_id == picks.c.id))
        .add_cte(stamped)
        .order_by(picks.c.ord)
    )


def _check_stamped(rows: list[Any], worker: str) -> None:
    """Every slot the claim locked was stamped, or the claim rolls back."""
    if rows and rows[0][6] != 0:
        raise ClaimContention(f"a rate slot of worker={worker} moved under the claim")


def _any(values: Select[Any], kind: Any) -> Any:
    """``= ANY`` of the array ``values`` selects (an array, not a set: the parentheses
    of a bare subquery would make it ANY of its rows)."""
    return any_(cast(values.scalar_subquery(), ARRAY(kind)))
