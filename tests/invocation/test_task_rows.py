"""A task that carries its source row (``Task.row``, read with its claim) runs without
reading it, on every database and in both runtimes (a thread's, an event loop's): the
handler gets the row as it was claimed; a session that needs the ORM's load (a listener
on it) reads the row as before."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from dbworker import Finished, Outcome
from dbworker.core.tasks import Result, ResultKind
from dbworker.invocation.async_runtime import AsyncRuntime
from dbworker.invocation.loading import SourceLoader
from dbworker.invocation.runtime import ChildConfig, Runtime
from waiting import wait_until

from .test_group import WORKER, GroupEffect, GroupItem, rig  # noqa: F401  (the fixture)

SEEN: list[tuple[int, str]] = []


def remember(source: GroupItem, session: Session) -> Outcome:
    SEEN.append((source.id, source.mode))
    session.add(GroupEffect(item_id=source.id))
    return Finished()


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The source ids read from now on, by any of the single path's loads."""
    read: list[Any] = []
    for name in ("load", "load_apart"):
        original = getattr(SourceLoader, name)

        def counted(
            loader: Any, session: Any, source_id: Any, *rest: Any, _o: Any = original
        ) -> Any:
            read.append(source_id)
            return _o(loader, session, source_id, *rest)

        monkeypatch.setattr(SourceLoader, name, counted)
    return read


def _noop(*_: Any) -> None:
    pass


@pytest.mark.parametrize("hooked", [False, True], ids=["carried", "session-needs-the-orm"])
def test_a_task_with_its_row_starts_without_reading_it(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    hooked: bool,
) -> None:
    setup = rig(["claimed"])
    (task,) = setup.tasks
    registration = setup.coordinator._registration(WORKER)
    with setup.engine.connect() as conn:
        rows = registration.source_rows(conn, [task.source_id])
    assert rows == {task.source_id: (task.source_id, "claimed")}
    # Changed after the claim: the handler sees the row as it was claimed.
    with setup.engine.begin() as conn:
        conn.execute(update(GroupItem).values(mode="changed"))
    carried = dataclasses.replace(task, handler=remember, row=rows[task.source_id])
    read = _reads(monkeypatch)
    SEEN.clear()
    if hooked:
        event.listen(Session, "do_orm_execute", _noop)
    try:
        result = setup.runtime.run(carried)
    finally:
        if hooked:
            event.remove(Session, "do_orm_execute", _noop)
    assert result.kind is ResultKind.FINISHED, result
    if hooked:  # read at its start (through one load or another)
        assert (set(read), SEEN) == ({task.source_id}, [(task.source_id, "changed")])
    else:
        assert (read, SEEN) == ([], [(task.source_id, "claimed")])
    assert setup.effects() == {task.source_id: 1}
    assert setup.finished_count() == 1


async def remember_async(source: GroupItem, session: AsyncSession) -> Outcome:
    SEEN.append((source.id, source.mode))
    session.add(GroupEffect(item_id=source.id))
    return Finished()


@pytest.mark.parametrize("hooked", [False, True], ids=["carried", "session-needs-the-orm"])
def test_an_async_task_with_its_row_starts_without_reading_it(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    hooked: bool,
) -> None:
    setup = rig(["claimed"])
    (task,) = setup.tasks
    registration = setup.coordinator._registration(WORKER)
    with setup.engine.connect() as conn:
        rows = registration.source_rows(conn, [task.source_id])
    with setup.engine.begin() as conn:
        conn.execute(update(GroupItem).values(mode="changed"))
    carried = dataclasses.replace(task, handler=remember_async, row=rows[task.source_id])
    read = _reads(monkeypatch)
    many = SourceLoader.load_many_apart

    def counted_many(loader: Any, wanted: Any, *rest: Any) -> Any:
        read.extend(source_id for _, source_id in wanted)
        return many(loader, wanted, *rest)

    monkeypatch.setattr(SourceLoader, "load_many_apart", counted_many)
    config = ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect))
    runtime = AsyncRuntime(config, capacity=1)

    async def main() -> Any:
        await runtime.warm_up()
        try:
            return await runtime.run(carried)
        finally:
            await runtime.dispose()

    SEEN.clear()
    if hooked:
        event.listen(Session, "do_orm_execute", _noop)
    try:
        result = asyncio.run(main())
    finally:
        if hooked:
            event.remove(Session, "do_orm_execute", _noop)
    assert result.kind is ResultKind.FINISHED, result
    if hooked:
        assert (set(read), SEEN) == ({task.source_id}, [(task.source_id, "changed")])
    else:
        assert (read, SEEN) == ([], [(task.source_id, "claimed")])
    assert setup.effects() == {task.source_id: 1}
    assert setup.finished_count() == 1


@pytest.mark.parametrize("hooked", [False, True], ids=["carried", "session-needs-the-orm"])
def test_a_threads_task_with_its_row_starts_without_reading_it(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    hooked: bool,
) -> None:
    # On threads, tasks arriving are read together (``ThreadReads``): one with its
    # row is not, and its thread makes its instance from the row.
    setup = rig(["claimed"])
    (task,) = setup.tasks
    registration = setup.coordinator._registration(WORKER)
    with setup.engine.connect() as conn:
        rows = registration.source_rows(conn, [task.source_id])
    with setup.engine.begin() as conn:
        conn.execute(update(GroupItem).values(mode="changed"))
    carried = dataclasses.replace(task, handler=remember, row=rows[task.source_id])
    read = _reads(monkeypatch)
    many = SourceLoader.load_many_apart

    def counted_many(loader: Any, wanted: Any, *rest: Any) -> Any:
        read.extend(source_id for _, source_id in wanted)
        return many(loader, wanted, *rest)

    monkeypatch.setattr(SourceLoader, "load_many_apart", counted_many)
    runtime = Runtime(ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect)))
    runtime.end_together()
    SEEN.clear()
    if hooked:
        event.listen(Session, "do_orm_execute", _noop)
    try:
        runtime.read_ahead(carried, starting=True)
        ended: list[Result] = []
        result = runtime.run_later(carried, ended.append)
        wait_until(lambda: result is not None or ended, "the task's result")
    finally:
        if hooked:
            event.remove(Session, "do_orm_execute", _noop)
        runtime.dispose()
    (outcome,) = [result] if result is not None else ended
    assert outcome.kind is ResultKind.FINISHED, outcome
    if hooked:
        assert (set(read), SEEN) == ({task.source_id}, [(task.source_id, "changed")])
    else:
        assert (read, SEEN) == ([], [(task.source_id, "claimed")])
    assert setup.effects() == {task.source_id: 1}
