"""Claim searches that start from the open execution records, whatever the statistics say.

An execution table keeps a FINISHED record for every row a worker ever processed; the
open records (pending, unfinished, working) are a small set, and they have the largest
keys. A planner left to choose may read the application's rows in the eligible query's
ORDER BY (or the execution table in key order) and meet open work only after walking
the whole history: it assumes open rows are spread evenly through the keys. It does so
with fresh statistics as soon as open work looks plentiful (a backlog), and with stale
ones at any time. Each built-in dialect therefore pins the open records as the outer
side of the search, with whatever its database offers; these are the shared pieces.

When the eligible query orders by the source key, the order is rewritten onto the
execution record's ``source_id`` (equal by the join), so that an index holding only open
records, in key order, serves it and the search stops at its limit: a claim then reads
a handful of index entries even in a backlog of millions.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Select, Table, asc, desc, nulls_first, nulls_last
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import operators
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter, BooleanClauseList, UnaryExpression
from sqlalchemy.sql.selectable import Alias, FromClause, Join
from sqlalchemy.sql.visitors import InternalTraversal

from ..core.status import OPEN, Phase
from .base import Dialect
from .terms import Claim, WorkerTable, status_in

_MODIFIERS: dict[Any, Callable[[ColumnElement[Any]], ColumnElement[Any]]] = {
    operators.asc_op: asc,
    operators.desc_op: desc,
    operators.nulls_first_op: nulls_first,
    operators.nulls_last_op: nulls_last,
}

#: ORDER BY terms that name a column of the SELECT list rather than an expression.
_REFERENCES = frozenset({"label_reference", "textual_label_reference", "textclause"})


class _PinnedJoin(Join):
    """An inner join whose left side (the execution table) the database must read first."""

    inherit_cache = True
    keyword: ClassVar[str]


class CrossJoin(_PinnedJoin):
    """SQLite never reorders the tables around a CROSS JOIN: the left one is the outer loop."""

    inherit_cache = True
    __visit_name__ = "dbworker_cross_join"
    keyword = "CROSS JOIN"


class IndexedCrossJoin(CrossJoin):
    """A CROSS JOIN whose left table SQLite reads through the index ``index`` (INDEXED
    BY: if the query cannot use that index, SQLite raises an error rather than choose
    another plan)."""

    inherit_cache = True
    # The index is part of the SQL, so it is part of the cache key. (Not a ClassVar:
    # SQLAlchemy declares the attribute without one, and mypy rejects the change.)
    _traverse_internals = [  # noqa: RUF012
        *Join._traverse_internals,
        ("index", InternalTraversal.dp_string),
    ]

    def __init__(
        self, left: FromClause, right: FromClause, onclause: ColumnElement[bool], index: str
    ) -> None:
        super().__init__(left, right, onclause)
        self.index = index


class StraightJoin(_PinnedJoin):
    """MySQL's STRAIGHT_JOIN reads the left table before the right one."""

    inherit_cache = True
    __visit_name__ = "dbworker_straight_join"
    keyword = "STRAIGHT_JOIN"


def _originals(elements: Iterable[FromClause]) -> Iterator[FromClause]:
    for element in elements:
        while element._is_clone_of is not None:
            element = element._is_clone_of
        yield element


@compiles(CrossJoin)
@compiles(IndexedCrossJoin)
@compiles(StraightJoin)
def _compile_pinned(
    join: _PinnedJoin,
    compiler: SQLCompiler,
    asfrom: bool = False,
    from_linter: Any = None,
    **kw: Any,
) -> str:
    # As SQLCompiler.visit_join, with the database's own join keyword.
    if from_linter:
        from_linter.edges.update(
            itertools.product(
                _originals(join.left._from_objects), _originals(join.right._from_objects)
            )
        )
    left = join.left._compiler_dispatch(compiler, asfrom=True, from_linter=from_linter, **kw)
    if isinstance(join, IndexedCrossJoin):
        left += f" INDEXED BY {compiler.preparer.quote(join.index)}"
    right = join.right._compiler_dispatch(compiler, asfrom=True, from_linter=from_linter, **kw)
    assert join.onclause is not None, "pinned joins are always built with an ON clause"
    on = join.onclause._compiler_dispatch(compiler, from_linter=from_linter, **kw)
    return f"{left} {join.keyword} {right} ON {on}"


def pin_open_records(
    query: Select[Any], worker: WorkerTable, join: type[_PinnedJoin], index: str | None = None
) -> Select[Any]:
    """``query`` (the eligible query, with the execution table's columns) with the
    execution table joined in front of the source table by ``join`` (a CROSS JOIN may
    name the ``index`` the execution table is read through)."""
    pk = worker.source_pk
    on = worker.table.c.source_id == pk
    if index is not None:
        assert join is CrossJoin, "only SQLite's CROSS JOIN names an index"
        return query.select_from(IndexedCrossJoin(worker.table, pk.table, on, index))
    return query.select_from(join(worker.table, pk.table, on))


def split_order(term: Any) -> tuple[ColumnElement[Any], list[Any]] | None:
    """An ORDER BY term as (expression, [modifiers, outermost first]); None for a term
    this module does not rewrite (a label reference, a textual ORDER BY)."""
    modifiers = []
    while isinstance(term, UnaryExpression) and term.modifier in _MODIFIERS:
        modifiers.append(term.modifier)
        term = term.element
    if (
        isinstance(term, UnaryExpression)
        or not isinstance(term, ColumnElement)
        or term.__visit_name__ in _REFERENCES
    ):
        return None
    return term, modifiers


def apply_modifiers(element: ColumnElement[Any], modifiers: list[Any]) -> ColumnElement[Any]:
    for modifier in reversed(modifiers):
        element = _MODIFIERS[modifier](element)
    return element


def is_source_key(element: ColumnElement[Any], worker: WorkerTable) -> bool:
    return bool(element.compare(worker.source_pk))


def key_direction(eligible: Select[Any], worker: WorkerTable) -> str | None:
    """``"asc"`` or ``"desc"`` when the eligible query orders by the source key first
    (so ordering by the execution record's ``source_id`` is the same order); else None.

    Only for integer keys: a string key's order depends on its column's collation,
    which the execution table's copy of the key need not share. The key is unique, so
    ORDER BY terms after it never decide anything.
    """
    if not worker.monotonic_keys or not eligible._order_by_clauses:
        return None
    first = split_order(eligible._order_by_clauses[0])
    if first is None or not is_source_key(first[0], worker):
        return None
    return "desc" if operators.desc_op in first[1] else "asc"


def in_direction(column: ColumnElement[Any], direction: str) -> ColumnElement[Any]:
    return column.desc() if direction == "desc" else column.asc()


def plain_shape(eligible: Select[Any]) -> bool:
    """Whether the eligible query is a plain filtered, ordered SELECT, which a rewrite
    into a per-record lookup keeps equivalent (no DISTINCT, GROUP BY, HAVING, LIMIT,
    OFFSET or FOR UPDATE of its own)."""
    return not (
        eligible._distinct
        or eligible._group_by_clauses
        or eligible._having_criteria
        or eligible._limit_clause is not None
        or eligible._offset_clause is not None
        or eligible._fetch_clause is not None
        or eligible._for_update_arg is not None
    )


def status_index(table: Table) -> str:
    """The name of the execution table's (status, source_id) index."""
    for index in table.indexes:
        if [c.name for c in index.columns] == ["status", "source_id"] and index.name:
            return str(index.name)
    raise LookupError(f"{table.name} has no (status, source_id) index")


def order_terms(query: Select[Any]) -> list[tuple[ColumnElement[Any], list[Any]]] | None:
    """``query``'s ORDER BY as (expression, modifiers) pairs (none without an ORDER BY);
    None when a term is one this module does not rewrite. A one-statement claim carries
    the expressions out of its search as columns, to return its rows in claim order."""
    terms = [split_order(term) for term in query._order_by_clauses]
    checked = [term for term in terms if term is not None]
    return checked if len(checked) == len(terms) else None


def claimed(rows: Iterable[Any]) -> list[Claim]:
    """Claims from rows of (source_id, token, attempts, failures, crashes) as a claim
    UPDATE stored them: the new token and counters, the status it set."""
    working = Phase.WORKING.value
    return [
        Claim(source_id, token, attempts, failures, crashes, working)
        for source_id, token, attempts, failures, crashes in rows
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class _Reusable:
    statement: Any
    #: The key of the statement's LIMIT parameter.
    limit_key: str
    #: The parameters of the eligible query the statement was built from, in the order
    #: SQLAlchemy's cache key lists them.
    binds: tuple[BindParameter[Any], ...]


def reuse(
    dialect: Dialect,
    key: tuple[Any, ...],
    eligible: Select[Any],
    limit: int,
    build: Callable[[], tuple[Any, str]],
) -> tuple[Any, dict[str, Any]]:
    """A claim statement for ``eligible`` and the parameters to run it with.

    Building a claim statement costs far more than running it, and every eligible
    query a worker returns has the same shape, so the statement is built once per
    shape (SQLAlchemy's cache key) and run with this call's values: the eligible
    query's parameters, which line up with those of the query it was built from as
    they do in SQLAlchemy's own statement cache, and the limit. ``build()`` returns
    the statement and the key of its LIMIT parameter.
    """
    cache_key = dialect._eligible_cache_key(key, eligible)
    if cache_key is None or dialect.clock is not None:
        # An element SQLAlchemy cannot cache, or a test clock's literal "now".
        return build()[0], {}

    def make() -> _Reusable:
        statement, limit_key = build()
        return _Reusable(statement, limit_key, tuple(cache_key.bindparams))

    built: _Reusable = dialect._built_once((*key, cache_key.key), make)
    # Same shape, so the same parameters in the same order (strict: a mismatch is a bug).
    pairs = zip(built.binds, cache_key.bindparams, strict=True)
    params = {old.key: new.effective_value for old, new in pairs}
    params[built.limit_key] = limit
    return built.statement, params


def limit_key(query: Select[Any]) -> str:
    """The key of ``query``'s LIMIT parameter (an integer limit is bound, not rendered)."""
    clause = query._limit_clause
    if not isinstance(clause, BindParameter):
        raise TypeError(f"expected a bound LIMIT, got {clause!r}")
    return str(clause.key)


def open_index(table: FromClause) -> str:
    """The name of the execution table's (or an alias's) open-records index: source_id,
    partial."""
    while isinstance(table, Alias):
        table = table.element
    assert isinstance(table, Table), table
    for index in table.indexes:
        if [c.name for c in index.columns] == ["source_id"] and index.name:
            return str(index.name)
    raise LookupError(f"{table.name} has no open-records index")


def implies_open(condition: ColumnElement[bool], table: FromClause) -> bool:
    """Whether ``condition`` has the open-records indexes' predicate (status IN the open
    phases) as one of its top-level AND terms: SQLite matches a partial index's
    predicate term by term, and uses (or may be told to use) the index only then."""
    terms: Iterable[Any] = [condition]
    if isinstance(condition, BooleanClauseList) and condition.operator is operators.and_:
        terms = condition.clauses
    # As Dialect.claimable spells it, and the schema's partial indexes too.
    predicate = status_in(table.c.status, OPEN)
    return any(term.compare(predicate) for term in terms)
