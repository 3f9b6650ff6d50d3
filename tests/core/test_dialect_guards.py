"""The dialects' SQL guards come from the transition table, not from a second copy of it.

Each dialect method is run against a connection that only records statements; the
``status IN (...)`` guard of every fenced UPDATE must list exactly
``core.transitions.sources(event)``. Replacing the table must change the SQL, which
shows the guard is derived rather than written out again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, Table
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect as SADialect

from dbworker.core.status import Phase
from dbworker.core.transitions import TRANSITIONS, Rule, Transition, sources
from dbworker.dialects import Dialect, ErrorInfo, WorkerTable, dialect_class
from dbworker.schema import execution_table

SQL_DIALECTS: dict[str, SADialect] = {
    "sqlite": sqlite.dialect(),
    "postgresql": postgresql.dialect(),  # type: ignore[no-untyped-call]
    "mysql": mysql.dialect(),
}

GUARD = re.compile(r"\bstatus IN \(([^)]*)\)")


class Recorder:
    """A stand-in Connection: records statements, reports one row changed."""

    def __init__(self) -> None:
        self.statements: list[Any] = []

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(statement)
        return SimpleNamespace(rowcount=1, scalar=lambda: None)


def worker_table() -> WorkerTable:
    metadata = MetaData()
    source = Table("source", metadata, Column("id", Integer, primary_key=True))
    table = execution_table("guarded", Integer(), metadata)
    return WorkerTable("guarded", table, source.c.id, monotonic_keys=True)


EVENT_CALLS: dict[Transition, Callable[[Dialect, Any, WorkerTable], object]] = {
    Transition.RENEW: lambda d, c, w: d.renew(c, w, [(1, 5)], 30.0),
    Transition.FINISH: lambda d, c, w: d.finish(c, w, 1, 5),
    Transition.UNFINISH: lambda d, c, w: d.unfinish(c, w, 1, 5, 2.0),
    Transition.FAIL: lambda d, c, w: d.fail(c, w, 1, 5, ErrorInfo("boom")),
    Transition.RETRY: lambda d, c, w: d.fail(c, w, 1, 5, ErrorInfo("boom"), 3.0),
    Transition.RELEASE: lambda d, c, w: d.release(
        c, w, 1, 5, ErrorInfo("stopped"), gives_up=False, counts_crash=False
    ),
    Transition.CRASH: lambda d, c, w: d.release(c, w, 1, 5, ErrorInfo("killed"), gives_up=False),
    Transition.GIVE_UP: lambda d, c, w: d.release(c, w, 1, 5, ErrorInfo("killed"), gives_up=True),
    Transition.RESET: lambda d, c, w: d.reset_failed(c, w, 1),
}


def guard_phases(backend: str, event: Transition) -> set[Phase]:
    dialect = dialect_class(backend)(clock=lambda: 1000.0)
    conn = Recorder()
    EVENT_CALLS[event](dialect, conn, worker_table())
    assert len(conn.statements) == 1, conn.statements
    sql = str(
        conn.statements[0].compile(
            dialect=SQL_DIALECTS[backend], compile_kwargs={"literal_binds": True}
        )
    )
    guards = GUARD.findall(sql)
    assert len(guards) == 1, sql
    return {Phase(value.strip().strip("'")) for value in guards[0].split(",")}


@pytest.mark.parametrize("backend", list(SQL_DIALECTS))
@pytest.mark.parametrize("event", list(EVENT_CALLS), ids=str)
def test_fenced_guards_match_the_table(backend: str, event: Transition) -> None:
    assert guard_phases(backend, event) == sources(event)


@pytest.mark.parametrize("backend", list(SQL_DIALECTS))
def test_guards_follow_a_changed_table(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    changed = dict(TRANSITIONS)
    changed[(Phase.UNFINISHED, Transition.RENEW)] = Rule(
        frozenset({Phase.UNFINISHED}), fenced=True, guard="-"
    )
    del changed[(Phase.FAILED, Transition.RESET)]
    changed[(Phase.FINISHED, Transition.RESET)] = Rule(frozenset({Phase.UNFINISHED}), False, "-")
    monkeypatch.setattr("dbworker.core.transitions.TRANSITIONS", changed)
    assert guard_phases(backend, Transition.RENEW) == {Phase.WORKING, Phase.UNFINISHED}
    assert guard_phases(backend, Transition.RESET) == {Phase.FINISHED}


@pytest.mark.parametrize("backend", list(SQL_DIALECTS))
def test_claimable_phases_are_the_claiming_events_sources(backend: str) -> None:
    dialect = dialect_class(backend)(clock=lambda: 1000.0)
    table = worker_table().table
    sql = str(
        dialect.claimable(table, dialect.now()).compile(
            dialect=SQL_DIALECTS[backend], compile_kwargs={"literal_binds": True}
        )
    )
    mentioned = {phase for phase in Phase if f"'{phase.value}'" in sql}
    assert mentioned == sources(Transition.CLAIM) | sources(Transition.TAKEOVER)
