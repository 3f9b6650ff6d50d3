"""A task that carries its source row (``Task.row``, read with its claim) runs without
reading it, on every database and in every runtime (a pool process's, a thread's, an
event loop's): the handler gets the row as it was claimed; a session that needs the
ORM's load (a listener on it) reads the row as before."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from dbworker import Finished, Outcome
from dbworker.core.tasks import Result, ResultKind, Task
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


async def remember_async(source: GroupItem, session: AsyncSession) -> Outcome:
    return remember(source, session.sync_session)


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The source ids read from now on, by any of the runtimes' loads."""
    read: list[Any] = []
    for name in ("load", "load_apart"):
        original = getattr(SourceLoader, name)

        def counted(
            loader: Any, session: Any, source_id: Any, *rest: Any, _o: Any = original
        ) -> Any:
            read.append(source_id)
            return _o(loader, session, source_id, *rest)

        monkeypatch.setattr(SourceLoader, name, counted)
    many = SourceLoader.load_many_apart

    def counted_many(loader: Any, wanted: Any, *rest: Any) -> Any:
        read.extend(source_id for _, source_id in wanted)
        return many(loader, wanted, *rest)

    monkeypatch.setattr(SourceLoader, "load_many_apart", counted_many)
    return read


def _noop(*_: Any) -> None:
    pass


@contextlib.contextmanager
def _listened(hooked: bool) -> Iterator[None]:
    """With ``hooked``, every session has a listener (it then needs the ORM's load)."""
    if hooked:
        event.listen(Session, "do_orm_execute", _noop)
    try:
        yield
    finally:
        if hooked:
            event.remove(Session, "do_orm_execute", _noop)


def _on_the_pool(setup: Any, task: Task) -> Result:
    return setup.runtime.run(task)  # type: ignore[no-any-return]


def _on_a_thread(setup: Any, task: Task) -> Result:
    # On threads, tasks arriving are read together (``ThreadReads``): one with its row
    # is not, and its thread makes its instance from the row.
    runtime = Runtime(ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect)))
    runtime.end_together()
    ended: list[Result] = []
    try:
        runtime.read_ahead(task, starting=True)
        result = runtime.run_later(task, ended.append)
        wait_until(lambda: result is not None or ended, "the task's result")
    finally:
        runtime.dispose()
    return result if result is not None else ended[0]


def _on_an_event_loop(setup: Any, task: Task) -> Result:
    config = ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect))
    runtime = AsyncRuntime(config, capacity=1)

    async def main() -> Result:
        await runtime.warm_up()
        try:
            return await runtime.run(dataclasses.replace(task, handler=remember_async))
        finally:
            await runtime.dispose()

    return asyncio.run(main())


RUNTIMES: dict[str, Callable[[Any, Task], Result]] = {
    "pool": _on_the_pool,
    "threads": _on_a_thread,
    "asyncio": _on_an_event_loop,
}


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("hooked", [False, True], ids=["carried", "session-needs-the-orm"])
def test_a_task_with_its_row_starts_without_reading_it(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    hooked: bool,
    runtime: str,
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
    with _listened(hooked):
        result = RUNTIMES[runtime](setup, carried)
    assert result.kind is ResultKind.FINISHED, result
    if hooked:  # read at its start (through one load or another)
        assert (set(read), SEEN) == ({task.source_id}, [(task.source_id, "changed")])
    else:
        assert (read, SEEN) == ([], [(task.source_id, "claimed")])
    assert setup.effects() == {task.source_id: 1}
    assert setup.finished_count() == 1
