"""Items that send nothing of their own, on a database whose driver can send a statement
as a transaction by itself (``Dialect.autocommitting``: PostgreSQL through psycopg):
the read of the rows and the fenced FINISH are all that crosses the wire, two round
trips, with no BEGIN and no COMMIT around them, alone or in a group; a claim lost
among them is told LOST without running anyone again, and commits nothing of its item."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from dbworker import ExecutionStatus
from dbworker.core.tasks import ResultKind
from dbworker.dialects import liveness
from dbworker.invocation.group import run_group
from wire import WireTrace

from .test_group import CALLS, Rig, never, rig, run_all  # noqa: F401  (the fixture)


def _autocommits(setup: Rig) -> bool:
    dialect = setup.runtime.dialect
    with setup.runtime.engine.connect() as conn, dialect.autocommitting(conn) as alone:
        return alone


@contextmanager
def wire(setup: Rig) -> Iterator[list[str]]:
    """The round trips of the handler process's connections meanwhile (``WireTrace``)."""
    trace = WireTrace()

    def on_checkout(dbapi_connection: Any, *_: Any) -> None:
        trace.follow(dbapi_connection)

    engine = setup.runtime.engine
    event.listen(engine, "checkout", on_checkout)
    trips: list[str] = []
    try:
        yield trips
    finally:
        event.remove(engine, "checkout", on_checkout)
        trips.extend(trace.round_trips())


@pytest.fixture(autouse=True)
def _no_idle_ping(monkeypatch: pytest.MonkeyPatch) -> None:
    # A connection is pinged before use after idling this long: not in these counts.
    monkeypatch.setattr(liveness, "IDLE_SECONDS", float("inf"))


@pytest.mark.backends("postgresql")
def test_a_group_of_quiet_items_costs_two_round_trips(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"] * 5)
    with wire(setup) as trips:
        results = run_group(setup.runtime, setup.tasks, never)
    assert [r.kind for r in results] == [ResultKind.FINISHED] * 5
    assert trips == ["SELECT", "UPDATE"], trips
    assert setup.finished_count() == 5


@pytest.mark.backends("postgresql")
def test_a_quiet_item_alone_costs_two_round_trips(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"])
    with wire(setup) as trips:
        assert setup.runtime.run(setup.tasks[0]).kind is ResultKind.FINISHED
    assert trips == ["SELECT", "UPDATE"], trips
    assert setup.finished_count() == 1


@pytest.mark.backends("postgresql")
def test_items_that_write_still_commit_together(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing", "ok", "nothing"])
    with wire(setup) as trips:
        results = run_group(setup.runtime, setup.tasks, never)
    assert [r.kind for r in results] == [ResultKind.FINISHED] * 3
    # The rows read by themselves; the write, its savepoint and the FINISH of all in
    # one transaction.
    assert trips[0] == "SELECT" and trips[1].startswith("BEGIN"), trips
    assert trips[-1] == "COMMIT" and "UPDATE" in trips[-2], trips
    assert setup.effects() == {2: 1}


def test_a_claim_lost_among_quiet_items_commits_nothing_of_it(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"] * 3)
    setup.take_over(2)
    results = run_all(setup)
    assert [r.kind for r in results] == [ResultKind.FINISHED, ResultKind.LOST, ResultKind.FINISHED]
    assert setup.status(2) is ExecutionStatus.WORKING
    assert [setup.status(i) for i in (1, 3)] == [ExecutionStatus.FINISHED] * 2
    # Finished by a statement of its own, the others' FINISH tells the lost one apart;
    # in the group's transaction it rolls the group back, and each runs again alone.
    ran = [1, 2, 3] if _autocommits(setup) else [1, 2, 3, 1, 2, 3]
    assert ran == CALLS


def test_a_watched_quiet_item_is_read_through_sqlalchemy_and_finishes(rig: Any) -> None:  # noqa: F811
    """Someone listening for statements gets SQLAlchemy's path (the ORM's read, a commit
    that ends it), by itself or not, and sees every statement."""
    setup = rig(["nothing"])
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement.split()[0].upper())

    event.listen(setup.runtime.engine, "before_cursor_execute", record)
    try:
        assert setup.runtime.run(setup.tasks[0]).kind is ResultKind.FINISHED
    finally:
        event.remove(setup.runtime.engine, "before_cursor_execute", record)
    assert "SELECT" in seen and "UPDATE" in seen, seen
    assert setup.finished_count() == 1
