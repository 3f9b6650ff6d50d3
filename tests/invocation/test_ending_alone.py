"""A handler that sent no statement and left nothing to flush ends with its status
change alone (``Dialect.record_alone``): on SQLite, which reads the source row apart,
one UPDATE that SQLite commits by itself, without BEGIN IMMEDIATE and COMMIT around it
(the write lock held for that statement only). Whatever a handler wrote or changed
still commits with its status change, and the alone ending is fenced like every other.
Run on every database in the test's own process, as a handler process runs tasks."""

from __future__ import annotations

import fcntl
import os
from typing import Any

import pytest
from sqlalchemy import create_engine, select, update

from dbworker import ExecutionStatus
from dbworker.core.policy import FINISHED
from dbworker.core.tasks import ResultKind
from dbworker.dialects.sqlite import SQLiteDialect
from dbworker.dialects.sqlite_turns import SUFFIX

from .test_group import GroupItem, Rig, rig  # noqa: F401  (the fixture)


def _statements(setup: Rig) -> list[str] | None:
    """The statements SQLite runs on the runtime's kept handler connection from now on
    (its own trace: no SQLAlchemy listener that would change the path taken)."""
    if setup.engine.dialect.name != "sqlite":
        return None
    seen: list[str] = []
    held = setup.runtime.held.take()
    held.write.connection.dbapi_connection.set_trace_callback(seen.append)  # type: ignore[union-attr]
    return seen


def _verbs(statements: list[str]) -> list[str]:
    return [s.split()[0].upper() for s in statements]


def test_a_handler_that_wrote_nothing_ends_with_its_status_change_alone(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing", "nothing"])
    seen = _statements(setup)
    results = [setup.runtime.run(task) for task in setup.tasks]
    assert [r.kind for r in results] == [ResultKind.FINISHED] * 2
    assert setup.finished_count() == 2
    assert setup.effects() == {}
    if seen is not None:
        assert _verbs(seen) == ["UPDATE", "UPDATE"], seen


def test_what_a_handler_wrote_or_changed_commits_with_its_status(rig: Any) -> None:  # noqa: F811
    setup = rig(["write", "touch"])
    seen = _statements(setup)
    results = [setup.runtime.run(task) for task in setup.tasks]
    assert [r.kind for r in results] == [ResultKind.FINISHED] * 2
    assert setup.finished_count() == 2
    assert setup.effects() == {1: 1}
    with setup.engine.connect() as conn:
        assert conn.scalar(select(GroupItem.mode).where(GroupItem.id == 2)) == "touched"
    if seen is not None:
        verbs = _verbs(seen)
        assert verbs.count("BEGIN") == 2 and verbs.count("COMMIT") == 2, seen


def test_an_alone_ending_is_fenced_by_the_claim(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"])
    task = setup.tasks[0]
    table = setup.coordinator._registration("grouped").table.table
    with setup.engine.begin() as conn:  # another claim took the item over
        conn.execute(
            update(table).where(table.c.source_id == task.source_id).values(token=task.token + 1)
        )
    assert setup.runtime.run(task).kind is ResultKind.LOST
    assert setup.status(task.source_id) is ExecutionStatus.WORKING


def test_sqlite_gives_its_write_turn_back_after_an_alone_ending(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"])
    if setup.engine.dialect.name != "sqlite":
        pytest.skip("SQLite's write turns only")
    assert setup.runtime.run(setup.tasks[0]).kind is ResultKind.FINISHED
    database = setup.engine.url.database
    assert database is not None
    fd = os.open(os.path.realpath(database) + SUFFIX, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the turn is still held
    finally:
        os.close(fd)


def test_sqlite_commits_an_alone_ending_on_an_engine_it_did_not_configure(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"])
    if setup.engine.dialect.name != "sqlite":
        pytest.skip("pysqlite's own implicit transactions only")
    task = setup.tasks[0]
    worker = setup.coordinator._registration("grouped").table
    plain = create_engine(setup.engine.url)  # pysqlite begins before an UPDATE by itself
    try:
        with plain.connect() as conn:
            assert SQLiteDialect().record_alone(conn, worker, task.source_id, task.token, FINISHED)
            assert not conn.in_transaction()
    finally:
        plain.dispose()
    assert setup.status(task.source_id) is ExecutionStatus.FINISHED
