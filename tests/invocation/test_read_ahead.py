"""Rows read ahead (``AsyncRuntime.read_ahead``), on every database: a task that waits
for a slot on the event loop has its row read then, and starts without reading it
again; a read ahead that failed or found no row is done again at the start; a task
withdrawn before it starts has its read dropped."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from sqlalchemy import update

from dbworker.core.tasks import Result, ResultKind, Task
from dbworker.invocation.async_runtime import AsyncRuntime
from dbworker.invocation.loading import SourceLoader
from dbworker.invocation.runtime import ChildConfig

from .test_endings_together import CALLS, GATE, Gate, handle
from .test_group import GroupItem, Rig, rig  # noqa: F401  (the fixture)

FINISHED = ResultKind.FINISHED


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The source ids read from now on, one entry per id, however they were read."""
    read: list[Any] = []
    load_apart, load_many = SourceLoader.load_apart, SourceLoader.load_many_apart

    def one(loader: SourceLoader, session: Any, source_id: Any, conn: Any) -> Any:
        read.append(source_id)
        return load_apart(loader, session, source_id, conn)

    def many(loader: SourceLoader, wanted: Any, conn: Any) -> Any:
        found = load_many(loader, wanted, conn)
        if found is not None:
            read.extend(source_id for _, source_id in wanted)
        return found

    monkeypatch.setattr(SourceLoader, "load_apart", one)
    monkeypatch.setattr(SourceLoader, "load_many_apart", many)
    return read


def _run(
    setup: Rig, scenario: Callable[[AsyncRuntime, list[Task]], Coroutine[Any, Any, list[Result]]]
) -> list[Result]:
    tasks = [dataclasses.replace(task, handler=handle) for task in setup.tasks]
    config = ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect))

    async def main() -> list[Result]:
        GATE[:] = [Gate(1)]
        runtime = AsyncRuntime(config, capacity=len(tasks))
        try:
            return await scenario(runtime, tasks)
        finally:
            await runtime.dispose()

    CALLS.clear()
    return asyncio.run(main())


async def _read_ahead(runtime: AsyncRuntime, tasks: list[Task]) -> None:
    for task in tasks:
        runtime.read_ahead(task)
    await asyncio.gather(*(early.read for early in runtime._ahead.values()))


def test_a_task_read_ahead_starts_without_reading_its_row_again(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["ok", "ok", "ok"])
    read = _reads(monkeypatch)
    before_start: list[Any] = []

    async def scenario(runtime: AsyncRuntime, tasks: list[Task]) -> list[Result]:
        await _read_ahead(runtime, tasks)
        before_start.extend(read)
        # Changed after the read: the handler gets the row as it was read ahead.
        with setup.engine.begin() as conn:
            conn.execute(update(GroupItem).values(mode="bad"))
        return list(await asyncio.gather(*(runtime.run(task) for task in tasks)))

    results = _run(setup, scenario)
    assert sorted(before_start) == [1, 2, 3], "read while they waited"
    assert sorted(read) == [1, 2, 3], "not read again at their start"
    assert [r.kind for r in results] == [FINISHED] * 3
    assert setup.effects() == {1: 1, 2: 1, 3: 1}
    assert setup.finished_count() == 3


@pytest.mark.parametrize("early", ["failed", "found nothing"])
def test_a_read_ahead_that_came_to_nothing_is_done_again_at_the_start(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    early: str,
) -> None:
    setup = rig(["ok", "ok"])
    load_apart = AsyncRuntime._load_apart
    ahead = True

    async def first_one_fails(runtime: AsyncRuntime, session: Any, task: Task, worker: Any) -> Any:
        if ahead and task.source_id == 1:
            if early == "failed":
                raise ConnectionError("the server went away")
            return None
        return await load_apart(runtime, session, task, worker)

    monkeypatch.setattr(AsyncRuntime, "_load_apart", first_one_fails)
    read = _reads(monkeypatch)

    async def scenario(runtime: AsyncRuntime, tasks: list[Task]) -> list[Result]:
        nonlocal ahead
        for task in tasks:
            runtime.read_ahead(task)
        await asyncio.gather(
            *(early.read for early in runtime._ahead.values()), return_exceptions=True
        )
        ahead = False
        return list(await asyncio.gather(*(runtime.run(task) for task in tasks)))

    results = _run(setup, scenario)
    assert [r.kind for r in results] == [FINISHED, FINISHED]
    assert sorted(read) == [1, 2], "the first read at its start, the second ahead only"
    assert setup.effects() == {1: 1, 2: 1}


def test_a_task_withdrawn_while_it_waits_has_its_read_dropped(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["ok", "ok"])
    read = _reads(monkeypatch)
    dropped: list[asyncio.Task[Any]] = []

    async def scenario(runtime: AsyncRuntime, tasks: list[Task]) -> list[Result]:
        first, second = tasks
        runtime.read_ahead(first)
        runtime.read_ahead(second)
        dropped.append(runtime._ahead[first.key].read)
        runtime.forget_ahead(first.key)
        assert list(runtime._ahead) == [second.key]
        await asyncio.gather(*dropped, return_exceptions=True)
        return [await runtime.run(second)]

    results = _run(setup, scenario)
    assert dropped[0].cancelled()
    assert [r.kind for r in results] == [FINISHED]
    assert read == [2]
    assert setup.effects() == {2: 1}
