"""Rows read ahead (``AsyncRuntime.read_ahead``, ``Runtime.read_ahead`` for threads),
on every database: a task that waits for a slot has its row read then, and starts
without reading it again; a read ahead that failed or found no row is done again at
the start; a task withdrawn before it starts has its read dropped. On threads, a
handler read ahead that sends no statement holds no transaction, and its ending goes
with others'."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from dbworker import Finished, Outcome
from dbworker.core.tasks import Result, ResultKind, Task
from dbworker.invocation.async_runtime import AsyncRuntime
from dbworker.invocation.loading import SourceLoader
from dbworker.invocation.runtime import ChildConfig, Runtime
from waiting import wait_until

from .test_endings_together import CALLS, GATE, Gate, handle
from .test_group import GroupEffect, GroupItem, Rig, rig  # noqa: F401  (the fixture)

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


# -- threads ---------------------------------------------------------------------------


def handle_quietly(source: GroupItem, session: Session) -> Outcome:
    """Writes its effect without a statement before it returns (no rollback either):
    read ahead, it holds no transaction when it returns."""
    CALLS.append(source.id)
    session.add(GroupEffect(item_id=source.id if source.mode == "ok" else None))
    return Finished()


def test_threads_a_task_read_ahead_starts_without_reading_and_ends_with_others(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["ok", "ok", "ok"])
    read = _reads(monkeypatch)
    runtime = Runtime(ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect)))
    runtime.end_together()
    assert runtime.reads is not None
    tasks = [dataclasses.replace(task, handler=handle_quietly) for task in setup.tasks]
    later: list[Result] = []
    delivered = threading.Semaphore(0)

    def deliver(result: Result) -> None:
        later.append(result)
        delivered.release()

    CALLS.clear()
    try:
        for task in tasks:
            runtime.read_ahead(task)
        reads = runtime.reads
        assert reads is not None
        wait_until(lambda: all(w.ended for w in reads._wanted.values()), "the reads")
        assert sorted(read) == [1, 2, 3], "read while they waited"
        # Changed after the read: the handler gets the row as it was read ahead (a
        # "bad" one would fail its flush).
        with setup.engine.begin() as conn:
            conn.execute(update(GroupItem).values(mode="bad"))
        now = [runtime.run_later(task, deliver) for task in tasks]
        if setup.runtime.dialect.group_commit:
            # Holding no transaction, each handed its ending over to go with others'.
            assert now == [None, None, None]
            for _ in tasks:
                assert delivered.acquire(timeout=30), "a handed-over ending never reported"
        else:
            later.extend(r for r in now if r is not None)
    finally:
        runtime.dispose()
    assert sorted(read) == [1, 2, 3], "not read again at their start"
    assert sorted(CALLS) == [1, 2, 3]
    assert [r.kind for r in later] == [FINISHED] * 3
    assert setup.effects() == {1: 1, 2: 1, 3: 1}
    assert setup.finished_count() == 3


def _thread_task(n: int) -> Task:
    return Task("w", n, 1, 1, 0, print, object)


def test_threads_reads_ahead_give_way_to_the_thread_that_starts_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task taken before its row was read is read by its thread (and no longer by the
    reads ahead); one taken while its read runs waits for it; a failed read, or a
    withdrawn task, gives nothing."""
    from dbworker.invocation import reading

    connecting = threading.Event()
    go = threading.Event()
    fail = [False]

    def connect() -> Any:
        connecting.set()
        assert go.wait(timeout=30)
        if fail[0]:
            raise ConnectionError("the server went away")
        return _StubConnection()

    def read_all(read: Any, batch: Any) -> None:
        for wanted in batch:
            wanted.found = f"row {wanted.source_id}"

    monkeypatch.setattr(reading, "_read_all", read_all)
    reads = reading.ThreadReads(connect, lambda task: None)  # type: ignore[arg-type,return-value]
    first, second, third = (_thread_task(n) for n in (1, 2, 3))
    try:
        reads.add(first, Session())
        assert connecting.wait(timeout=30), "the reading thread took the first"
        reads.add(second, Session())
        reads.add(third, Session())
        assert reads.take(second.key) is None, "not read yet: its thread reads it"
        reads.forget(third.key)
        assert list(reads._queued) == [] and list(reads._wanted) == [first.key]
        assert _taken_once_read(reads, first.key, go, "the read under way") == "row 1"
        fail[0] = True
        reads._read = None
        reads.add(second, Session())
        wait_until(lambda: reads._wanted[second.key].ended, "the failed read")
        assert reads.take(second.key) is None, "a failed read gives nothing"
    finally:
        go.set()
        reads.close()


def _taken_once_read(reads: Any, key: Any, go: threading.Event, what: str) -> Any:
    """``reads.take(key)`` from a thread of its own: it must wait (for ``what``) until
    ``go`` lets the reads on; the row it then got."""
    taken: list[Any] = []
    taker = threading.Thread(target=lambda: taken.append(reads.take(key)))
    taker.start()
    time.sleep(0.05)
    assert taker.is_alive(), f"it waits for {what} instead of reading itself"
    go.set()
    taker.join(timeout=30)
    assert taken and taken[0] is not None
    return taken[0][1]


class _StubConnection:
    def invalidate(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_threads_a_starting_task_waits_for_its_read_which_goes_first_and_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task that starts at once is read by the reading thread, not by its own (it
    waits for that read even before it is under way), before the reads of tasks
    that wait for a thread and in a statement without them."""
    from dbworker.invocation import reading

    go = threading.Event()
    batches: list[list[Any]] = []

    def read_all(read: Any, batch: Any) -> None:
        assert go.wait(timeout=30)
        batches.append([wanted.source_id for wanted in batch])
        for wanted in batch:
            wanted.found = f"row {wanted.source_id}"

    monkeypatch.setattr(reading, "_read_all", read_all)
    reads = reading.ThreadReads(_StubConnection, lambda task: None)  # type: ignore[arg-type,return-value]
    busy, waiting, starting = _thread_task(1), _thread_task(2), _thread_task(3)
    try:
        reads.add(busy, Session())  # under way, holding the reading thread
        wait_until(lambda: not reads._queued, "the reading thread to take it")
        reads.add(waiting, Session())
        reads.add(starting, Session(), starting=True)
        assert _taken_once_read(reads, starting.key, go, "the reading thread") == "row 3"
        wait_until(lambda: len(batches) == 3, "the waiting task's read")
        assert batches == [[1], [3], [2]], "the starting read first, alone"
    finally:
        go.set()
        reads.close()
