"""An ``exclusive_by`` claim in one statement (issue 26, see ``limited.py``): on
PostgreSQL (``supports_stamp_in_claim``: data-modifying CTEs) a SELECT around the
claim's UPDATE; on SQLite (one claimer at a time, under its write lock) the UPDATE
itself, whose WHERE holds the search.

The search (the limited claim's own, busy keys skipped, planned under the claim's plan
settings) is a MATERIALIZED CTE of up to ``window`` rows; the first row of each key in
the search's order, up to ``limit``, goes to the claim's lock-and-claim UPDATE (the
advisory key guard and the row lock's SKIP LOCKED as in ``_lock_and_claim``), whose
RETURNING comes back in the search's order: the search's round trip saved (on SQLite,
0.95 -> 0.74 ms a claim of 30: the write lock is held that much less). A key taken by
a claim that committed while this one ran fails at the unique index, as the
two-statement claim does: ``ClaimContention``, and the loop claims again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from typing import cast as typing_cast

from sqlalchemy import Connection, Integer, Select, bindparam, func, or_, select
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.visitors import replacement_traverse

from .terms import Claims, Limits, WorkerTable, keyed_rows

if TYPE_CHECKING:
    from .base import Dialect
    from .claiming import Claiming

_LIMIT = "dbworker_keyed_limit"
#: The exclusive key's column in the search (after the six claim columns).
_KEY_AT = 6


def keyed_at_once(
    dialect: Claiming, worker: WorkerTable, limits: Limits, eligible: Select[Any]
) -> bool:
    """Whether an ``exclusive_by`` claim searches and claims in one statement
    (``keyed_claim``), without a rate limit: where data-modifying CTEs are (PostgreSQL),
    for an ORDER BY the statement can carry out of its search; where one claimer runs
    at a time and an UPDATE returns its rows (SQLite), for the source key's order, the
    only one its rows can be put back in."""
    if limits.rate is not None or not limits.keyed:
        return False
    from .open_first import key_direction, order_terms  # open_first imports base: a cycle

    if dialect.supports_stamp_in_claim:
        return order_terms(eligible) is not None
    return _update_alone(dialect) and key_direction(eligible, worker) is not None


def _update_alone(dialect: Claiming) -> bool:
    """SQLite: the claim's one UPDATE ... RETURNING is the statement (its write lock
    keeps every other claim out, so the search's rows are the rows it claims)."""
    return not dialect.supports_concurrent_claims and dialect.supports_one_statement_claims


def claim_keyed(
    dialect: Claiming,
    conn: Connection,
    worker: WorkerTable,
    eligible: Select[Any],
    limit: int,
    search: Callable[[], Select[Any]],
    claim: Callable[[], Any],
    key: tuple[Any, ...],
    window: str,
) -> Claims:
    """Claim up to ``limit`` records, one per key, in one statement: ``search()`` is the
    limited search (LIMIT bound as ``window``), ``claim()`` the lock-and-claim UPDATE of
    the records ``ids``; built once per eligible-query shape under ``key``."""
    from .open_first import claimed, key_direction, reuse  # open_first imports base: a cycle

    alone = not dialect.supports_stamp_in_claim and _update_alone(dialect)
    build = _update if alone else _statement
    statement, params = reuse(
        typing_cast("Dialect", dialect),
        key,
        eligible,
        0,
        lambda: (build(search(), claim()), window),
    )
    params[window] = 2 * limit + 8
    params[_LIMIT] = limit
    params.update(dialect._plan_params(conn))
    # On the driver's cursor: SQLAlchemy's execution around it was a third of a SQLite
    # claim's time (under the write lock), 0.1-0.2 ms of PostgreSQL's.
    rows = keyed_rows(conn, statement, params, worker.name, dialect._rows_of)
    if alone:
        # RETURNING has no order; in key order the key alone gives it back.
        rows.sort(key=lambda row: row[0], reverse=key_direction(eligible, worker) == "desc")
        return Claims.of(claimed(rows))
    taken = [row for row in rows if row[1] is not None]
    return Claims.of(claimed(taken), len(rows) - len(taken))


def _statement(search: Select[Any], claim: Any) -> Any:
    found, firsts, order = _firsts(search)
    done = replacement_traverse(claim, {}, _claiming(firsts)).cte("dbworker_claimed")
    c = done.c
    # Every row picked, with its claim if it got one: a row the row lock skipped (held
    # by another claim) is reported skipped, so that the loop looks again soon.
    return (
        select(firsts.c.source_id, c.token, c.attempts, c.failures, c.crashes)
        .select_from(
            firsts.join(found, found.c.source_id == firsts.c.source_id).outerjoin(
                done, c.source_id == firsts.c.source_id
            )
        )
        .order_by(*order(found))
    )


def _update(search: Select[Any], claim: Any) -> Any:
    """The claim's UPDATE ... RETURNING of the first row of each key the search finds."""
    return replacement_traverse(claim, {}, _claiming(_firsts(search)[1]))


def _claiming(firsts: Any) -> Callable[..., Any]:
    """A replacement of the claim's ``ids`` by the rows ``firsts`` picks."""

    def replace(element: Any, **_kw: Any) -> Any:
        if isinstance(element, BindParameter) and element.key == "ids":
            return select(firsts.c.source_id).scalar_subquery()
        return None

    return replace


def _firsts(search: Select[Any]) -> tuple[Any, Any, Callable[[Any], list[Any]]]:
    """The search as a CTE, the first row of each key in its order up to the limit as
    another, and the order of a selectable with the search's order columns."""
    from .open_first import apply_modifiers, order_terms

    terms = order_terms(search)
    if terms is None:
        raise TypeError("a one-statement keyed claim needs a search it can order by")
    found = (
        search.add_columns(
            *[element.label(f"dbworker_order_{i}") for i, (element, _) in enumerate(terms)]
        )
        .cte("dbworker_found")
        .prefix_with("MATERIALIZED")
    )
    columns = list(found.c)
    held = columns[_KEY_AT]

    def order(table: Any) -> list[Any]:
        return [
            apply_modifiers(table.c[f"dbworker_order_{i}"], modifiers)
            for i, (_, modifiers) in enumerate(terms)
        ]

    ranked = select(
        found.c.source_id,
        held.label("dbworker_key"),
        *[found.c[f"dbworker_order_{i}"] for i in range(len(terms))],
        func.row_number().over(partition_by=held, order_by=order(found)).label("dbworker_nth"),
    ).subquery("dbworker_ranked")
    firsts = (
        select(ranked.c.source_id)
        .where(or_(ranked.c.dbworker_nth == 1, ranked.c.dbworker_key.is_(None)))
        .order_by(*order(ranked))
        .limit(bindparam(_LIMIT, type_=Integer()))
        .cte("dbworker_firsts")
        .prefix_with("MATERIALIZED")
    )
    return found, firsts, order
