"""Fenced transitions: the status changes only the holder of the current token may
make (and the unfenced reset), as one UPDATE guarded by the transition table.

A mixin of ``Dialect``: it needs the dialect's clock (``now``) and its cache of built
statements, and nothing else of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Table,
    bindparam,
    null,
    select,
    tuple_,
    update,
)
from sqlalchemy.sql.expression import ClauseElement

from ..core.policy import Decision
from ..core.status import Phase
from ..core.tasks import (
    MAX_ERROR_CHARS,
    MAX_ERROR_TYPE_CHARS,
    MAX_TRACEBACK_CHARS,
    ErrorInfo,
    bounded,
)
from ..core.transitions import (
    ERROR,
    LATER,
    NULL,
    ROWS,
    ZERO,
    Transition,
    Value,
    is_fenced,
    releasing,
    sets_status,
    sources,
)
from ..core.transitions import INCREMENT as INCREMENT_VALUE
from ..core.transitions import NOW as NOW_VALUE
from .driver_cursor import DriverForms
from .terms import NEVER_ISSUED_TOKEN, Clock, WorkerTable, status_in, status_literal


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: A fenced transition's value: the database's clock when the statement runs.
NOW = _Marker("NOW")
#: A fenced transition's value: the column's current value plus one.
INCREMENT = _Marker("INCREMENT")


@dataclasses.dataclass(frozen=True, slots=True)
class Later:
    """A fenced transition's value: ``seconds`` after the database's clock."""

    seconds: float


def _value_params(
    values: Mapping[str, Any], kinds: Sequence[tuple[str, str]] | None = None
) -> dict[str, Any]:
    """The bound parameters of a fenced UPDATE's ``values`` (constants are in its SQL);
    ``kinds``: each value's ``_value_kind``, when the caller has them already."""
    if kinds is None:
        kinds = [(name, _value_kind(value)) for name, value in values.items()]
    params: dict[str, Any] = {}
    for (name, kind), value in zip(kinds, values.values(), strict=True):
        if kind == "later":
            params[f"set_{name}"] = float(value.seconds)
        elif kind == "value":
            params[f"set_{name}"] = value
    return params


def _value_kind(value: Any) -> str:
    if value is NOW:
        return "now"
    if value is INCREMENT:
        return "increment"
    if isinstance(value, Later):
        return "later"
    if isinstance(value, ClauseElement):
        return "sql"
    # Constants are written into the statement, not bound: fewer parameters for the
    # driver to escape or send on every execution (the finish of every item).
    if value is None:
        return "null"
    if isinstance(value, Phase):
        return "phase"
    return "value"


class FencedTransitions:
    """The fenced UPDATEs of every dialect (a mixin of ``Dialect``)."""

    clock: Clock | None
    _driver_forms: DriverForms

    def now(self) -> ColumnElement[float]:  # pragma: no cover - Dialect provides it
        raise NotImplementedError

    def _built_once(
        self, key: tuple[Any, ...], build: Callable[[], Any]
    ) -> Any:  # pragma: no cover
        raise NotImplementedError

    def _matched(
        self, conn: Connection, key: tuple[Any, ...], statement: Any, params: dict[str, Any]
    ) -> int:  # pragma: no cover - DialectInterface provides it
        raise NotImplementedError

    def _rows_of(
        self, conn: Connection, key: Any, statement: Any, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:  # pragma: no cover - DialectInterface provides it
        raise NotImplementedError

    def autocommitting(
        self, conn: Connection
    ) -> AbstractContextManager[bool]:  # pragma: no cover - DialectInterface provides it
        raise NotImplementedError

    def _fenced(
        self,
        conn: Connection,
        worker: WorkerTable,
        event: Transition,
        source_id: Any,
        token: int,
        values: Mapping[str, Any],
    ) -> bool:
        """Apply ``event`` if ``token`` is still current; False means the claim was lost.

        ``values`` maps columns to Python values (bound at execution), ``NOW``,
        ``Later(seconds)``, ``INCREMENT`` or an SQL expression. Without expressions the
        statement is built once per table and shape and only its parameters change:
        a handler process completes its one item without building SQL.
        """
        table = worker.table
        kinds = [(name, _value_kind(value)) for name, value in values.items()]
        # A constant written into the statement is part of its shape.
        shape = tuple(
            (name, kind, values[name] if kind == "phase" else None) for name, kind in kinds
        )
        params = {"fence_source_id": source_id}
        if is_fenced(event):
            params["fence_token"] = token
        params |= _value_params(values, kinds)
        if any(kind == "sql" for _, kind in kinds):
            statement = self._fenced_update(table, event, values)
            return conn.execute(statement, params).rowcount == 1
        key = ("fenced", table, event, shape)
        statement = self._built_once(key, lambda: self._fenced_update(table, event, values))
        return self._matched(conn, key, statement, params) == 1

    def finish_all(
        self, conn: Connection, worker: WorkerTable, held: Sequence[tuple[Any, int]]
    ) -> int:
        """FINISH each of the ``held`` (source id, token) pairs whose token is current, in
        one UPDATE; the number of rows it matched (a group's finished items, recorded just
        before its COMMIT: fewer than ``len(held)`` means a claim was lost)."""
        if not held:
            return 0
        key, statement, params = self._finish_all(worker, held, returning=False)
        return self._matched(conn, key, statement, params)

    def finish_all_returning(
        self, conn: Connection, worker: WorkerTable, held: Sequence[tuple[Any, int]]
    ) -> set[Any]:
        """``finish_all``, naming the source ids it matched (UPDATE ... RETURNING, where
        the database has it): for items that wrote nothing, finished by a statement that
        is its own transaction, whose lost claims are told apart from the others."""
        if not held:
            return set()
        key, statement, params = self._finish_all(worker, held, returning=True)
        return {row[0] for row in self._rows_of(conn, key, statement, params)}

    def _finish_all(
        self, worker: WorkerTable, held: Sequence[tuple[Any, int]], returning: bool
    ) -> tuple[tuple[Any, ...], Any, dict[str, Any]]:
        values = self._row_values(Transition.FINISH, None, None)
        table = worker.table
        # One statement per power of two of pairs, the last pair repeated to fill it (a
        # row matches once, however often its pair is listed): built once, run on the
        # driver's cursor like every other fenced UPDATE. One per count compiled a new
        # statement for most batches of a process's first minutes (0.6 ms each).
        every = 1 << (len(held) - 1).bit_length()
        key = ("fenced_all", table, every, returning)

        def build() -> Any:
            statement = self._fenced_update(table, Transition.FINISH, values, every=every)
            return statement.returning(table.c.source_id) if returning else statement

        statement = self._built_once(key, build)
        params = _value_params(values)
        for index in range(every):
            source_id, token = held[min(index, len(held) - 1)]
            params[f"fence_source_id_{index}"] = source_id
            params[f"fence_token_{index}"] = token
        return key, statement, params

    def _fenced_update(
        self, table: Table, event: Transition, values: Mapping[str, Any], every: int = 0
    ) -> Any:
        """The UPDATE of ``event`` for one source id and token, or with ``every`` for
        that many (source id, token) pairs."""
        now = self.now()

        def column_value(name: str, value: Any) -> Any:
            column = table.c[name]
            kind = _value_kind(value)
            if kind == "now":
                return now
            if kind == "later":
                return now + bindparam(f"set_{name}", type_=Float())
            if kind == "increment":
                return column + 1
            if kind == "sql":
                return value
            if kind == "null":
                return null()
            if kind == "phase":
                return status_literal(value)
            return bindparam(f"set_{name}", type_=column.type)

        # A field the table lacks (``held_key``, only an exclusive_by worker's table
        # has it) is left out, so other workers' statements are what they always were.
        values = {name: value for name, value in values.items() if name in table.c}
        guard = [
            table.c.source_id == bindparam("fence_source_id"),
            status_in(table.c.status, sources(event)),
        ]
        if every:
            ids = [
                bindparam(f"fence_source_id_{i}", type_=table.c.source_id.type)
                for i in range(every)
            ]
            tokens = [bindparam(f"fence_token_{i}", type_=table.c.token.type) for i in range(every)]
            # The ids' IN finds the rows by the primary key, whatever a planner makes of
            # pairs; the pairs' IN is the fence.
            guard[0] = table.c.source_id.in_(ids)
            pairs = tuple_(table.c.source_id, table.c.token)
            guard.append(pairs.in_([tuple_(i, t) for i, t in zip(ids, tokens, strict=True)]))
        elif is_fenced(event):
            # Only the holder of the current token may cause a fenced event.
            guard.append(table.c.token == bindparam("fence_token"))
        return (
            update(table)
            .where(*guard)
            .values(
                {name: column_value(name, value) for name, value in values.items()}
                | {"updated_at": now}
            )
        )

    def transition(
        self,
        conn: Connection,
        worker: WorkerTable,
        transition: Transition,
        source_id: Any,
        token: int,
        *,
        delay: float | None = None,
        error: ErrorInfo | None = None,
    ) -> bool:
        """Write ``transition``'s row of the transition table (``core.transitions.ROWS``)
        for ``source_id``, fenced by ``token`` when the row is; False means the claim was
        lost. ``delay`` is what the row's ``LATER`` adds to now, ``error`` what its
        ``ERROR`` fields hold."""
        values = self._row_values(transition, delay, error)
        return self._fenced(conn, worker, transition, source_id, token, values)

    def _row_values(
        self, transition: Transition, delay: float | None, error: ErrorInfo | None
    ) -> dict[str, Any]:
        """A row's fields as ``_fenced`` values, in the row's order."""
        row = ROWS[transition]
        static = _STATIC_VALUES.get(transition)
        if static is not None:
            return static
        values: dict[str, Any] = {"status": row.target} if sets_status(row) else {}
        for name, value in row.sets.items():
            if value is LATER:
                if delay is None:
                    raise ValueError(f"{transition.value} needs a delay")
                values[name] = Later(delay)
            elif value is ERROR:
                if error is None:
                    raise ValueError(f"{transition.value} needs an error")
                values[name] = _error_text(name, error)
            else:
                values[name] = _static_value(name, value)
        if not any(v is LATER or v is ERROR for v in row.sets.values()):
            # The same every time (a finish, a reset): built once, not per item.
            _STATIC_VALUES[transition] = values
        return values

    def renew(
        self,
        conn: Connection,
        worker: WorkerTable,
        held: Sequence[tuple[Any, int]],
        lease_seconds: float,
    ) -> list[Any]:
        """Extend the leases of ``held`` (source id, token) pairs; return the ids whose
        token is no longer current, or that are no longer WORKING under it."""
        return [
            source_id
            for source_id, token in held
            if not self.transition(
                conn, worker, Transition.RENEW, source_id, token, delay=lease_seconds
            )
        ]

    def current_token(self, conn: Connection, worker: WorkerTable, source_id: Any) -> int | None:
        table = worker.table
        return conn.execute(select(table.c.token).where(table.c.source_id == source_id)).scalar()

    def finish(self, conn: Connection, worker: WorkerTable, source_id: Any, token: int) -> bool:
        return self.transition(conn, worker, Transition.FINISH, source_id, token)

    def unfinish(
        self, conn: Connection, worker: WorkerTable, source_id: Any, token: int, delay: float
    ) -> bool:
        return self.transition(conn, worker, Transition.UNFINISH, source_id, token, delay=delay)

    def fail(
        self,
        conn: Connection,
        worker: WorkerTable,
        source_id: Any,
        token: int,
        error: ErrorInfo,
        retry_delay: float | None = None,
    ) -> bool:
        """FAILED, or UNFINISHED for ``retry_delay`` seconds when a retry policy allows."""
        transition = Transition.FAIL if retry_delay is None else Transition.RETRY
        return self.transition(
            conn, worker, transition, source_id, token, delay=retry_delay, error=error
        )

    def release(
        self,
        conn: Connection,
        worker: WorkerTable,
        source_id: Any,
        token: int,
        error: ErrorInfo,
        *,
        gives_up: bool,
        counts_crash: bool = True,
    ) -> bool:
        """Give the item up: claimable again at once, or FAILED when the failure policy
        ``gives_up``; ``counts_crash`` counts it towards the worker's crash limit."""
        transition = releasing(gives_up=gives_up, counts_crash=counts_crash)
        return self.transition(conn, worker, transition, source_id, token, error=error)

    def record(
        self,
        conn: Connection,
        worker: WorkerTable,
        source_id: Any,
        token: int,
        decision: Decision,
        error: ErrorInfo | None = None,
    ) -> bool:
        """Record what the failure policy decided (``core.policy.decide``), fenced by
        ``token``; False means the claim was lost. A decision to record nothing is True.

        Each family of rows goes through its method (``finish``, ``unfinish``, ``fail``,
        ``release``), so a dialect that overrides one of them is used for all of its rows.
        """
        transition = decision.transition
        if transition is None:
            return True
        if transition is Transition.FINISH:
            return self.finish(conn, worker, source_id, token)
        if transition is Transition.UNFINISH:
            return self.unfinish(conn, worker, source_id, token, decision.delay or 0.0)
        error = error or ErrorInfo("unknown error")
        if transition is Transition.FAIL or transition is Transition.RETRY:
            delay = decision.delay or 0.0 if transition is Transition.RETRY else None
            return self.fail(conn, worker, source_id, token, error, delay)
        if transition in _RELEASES:
            return self.release(
                conn,
                worker,
                source_id,
                token,
                error,
                gives_up=decision.gives_up,
                counts_crash=decision.counts_crash,
            )
        raise ValueError(f"{transition.value} is not an invocation's ending")

    def record_alone(
        self,
        conn: Connection,
        worker: WorkerTable,
        source_id: Any,
        token: int,
        decision: Decision,
    ) -> bool:
        """``record`` as a transaction of its own on ``conn`` (which is in none): the
        ending of a handler that wrote nothing, whose status change is all there is to
        commit. A dialect whose connections commit one statement by themselves may run
        it without BEGIN and COMMIT around it (``autocommitting``)."""
        with self.autocommitting(conn), conn.begin():
            return self.record(conn, worker, source_id, token, decision)

    def finish_all_alone(
        self, conn: Connection, worker: WorkerTable, held: Sequence[tuple[Any, int]]
    ) -> set[Any]:
        """``finish_all_returning`` as a transaction of its own on ``conn`` (which is in
        none): the endings of handlers that wrote nothing. The source ids it matched."""
        with self.autocommitting(conn), conn.begin():
            return self.finish_all_returning(conn, worker, held)

    def reset_failed(self, conn: Connection, worker: WorkerTable, source_id: Any) -> bool:
        # RESET is not fenced (any caller may reset a FAILED record): no token to check.
        return self.transition(conn, worker, Transition.RESET, source_id, NEVER_ISSUED_TOKEN)


_RELEASES = frozenset({Transition.RELEASE, Transition.CRASH, Transition.GIVE_UP})
#: The values of rows that are the same every time, by transition (filled as used).
_STATIC_VALUES: dict[Transition, dict[str, Any]] = {}
#: Where each error field's text comes from, and how long it may be.
_ERROR_PARTS = {
    "error": ("message", MAX_ERROR_CHARS),
    "error_type": ("type", MAX_ERROR_TYPE_CHARS),
    "traceback": ("traceback", MAX_TRACEBACK_CHARS),
}


def _error_text(name: str, error: ErrorInfo) -> str | None:
    part, limit = _ERROR_PARTS[name]
    text: str | None = getattr(error, part)
    return bounded(text, limit)


def _static_value(name: str, value: Value) -> Any:
    if value is NOW_VALUE:
        return NOW
    if value is INCREMENT_VALUE:
        return INCREMENT
    if value is NULL:
        return None
    if value is ZERO:
        return 0
    raise ValueError(f"a fenced transition cannot set {name} to {value.name}")
