"""A handler's connection is taken at its session's first statement
(``HandlerSession._dbworker_lend``), on every database and both many-at-once
executors: handlers that send none (an I/O wait, their rows read apart, their writes
ending with others') hold no connection, so a wave of them opens none of its own; one
that sends a statement gets its connection then, and its writes commit with its fenced
status change as before; a cancelled one's connection is discarded, never kept."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from dbworker import ExecutionStatus, Finished, Outcome
from dbworker.core.tasks import Result, ResultKind, Task
from dbworker.invocation.async_runtime import AsyncRuntime
from dbworker.invocation.reading import READS_AT_ONCE
from dbworker.invocation.runtime import ChildConfig, Runtime
from dbworker.invocation.turns import ENDING_AT_ONCE
from waiting import wait_until

from .test_group import GroupEffect, GroupItem, Rig, rig  # noqa: F401  (the fixture)

FINISHED = ResultKind.FINISHED
#: Handlers in flight at once in each test: more than the connections a process
#: keeps for reads and endings, so that a connection per handler would show.
AT_ONCE = 12


def _connects(engine: Engine, opened: list[int]) -> list[int]:
    """``opened``, given one entry per new DBAPI connection of ``engine`` from now on."""
    event.listen(engine, "connect", lambda *_: opened.append(1))
    return opened


class _Arrivals:
    """Lets handlers return once all ``expected`` are in flight, and records whether
    each held a connection then."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.bound: list[bool] = []
        self.all_in = threading.Event()

    def arrive(self, session: Session) -> None:
        self.bound.append(session.bind is not None)
        if len(self.bound) >= self.expected:
            self.all_in.set()


ARRIVALS: list[_Arrivals] = []


async def wait_quietly(source: GroupItem, session: AsyncSession) -> Outcome:
    ARRIVALS[0].arrive(session.sync_session)
    while not ARRIVALS[0].all_in.is_set():
        await asyncio.sleep(0.005)
    session.add(GroupEffect(item_id=source.id))
    return Finished()


async def query_first(source: GroupItem, session: AsyncSession) -> Outcome:
    assert session.sync_session.bind is None, "no connection before its first statement"
    assert (await session.execute(select(GroupItem.mode).filter_by(id=source.id))).scalar()
    assert session.sync_session.bind is not None
    session.add(GroupEffect(item_id=source.id))
    return Finished()


SENT: list[Any] = []


async def hang_after_a_statement(source: GroupItem, session: AsyncSession) -> Outcome:
    await session.execute(select(GroupItem.id).filter_by(id=source.id))
    SENT.append(await session.connection())
    await asyncio.sleep(3600)
    return Finished()


def _run_async(
    setup: Rig,
    handler: Callable[..., Any],
    scenario: Callable[[AsyncRuntime, list[Task]], Any] | None = None,
) -> tuple[list[Result], list[int], AsyncRuntime]:
    tasks = [dataclasses.replace(task, handler=handler) for task in setup.tasks]
    config = ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect))
    runtime = AsyncRuntime(config, capacity=len(tasks))
    opened: list[int] = []

    async def main() -> list[Result]:
        await runtime.warm_up()
        _connects(runtime.engine.sync_engine, opened)
        try:
            if scenario is not None:
                return list(await scenario(runtime, tasks))
            return list(await asyncio.gather(*(runtime.run(task) for task in tasks)))
        finally:
            await runtime.dispose()

    ARRIVALS[:] = [_Arrivals(len(tasks))]
    results = asyncio.run(main())
    return results, opened, runtime


def test_async_handlers_that_send_no_statement_open_no_connection(
    rig: Any,  # noqa: F811
) -> None:
    setup = rig(["ok"] * AT_ONCE)
    results, opened, _ = _run_async(setup, wait_quietly)
    assert [r.kind for r in results] == [FINISHED] * AT_ONCE
    assert ARRIVALS[0].bound == [False] * AT_ONCE, "none held a connection while it waited"
    # The reads and the endings' connections, which the process keeps: none per handler.
    assert len(opened) <= READS_AT_ONCE + ENDING_AT_ONCE, len(opened)
    assert setup.effects() == {i: 1 for i in range(1, AT_ONCE + 1)}
    assert setup.finished_count() == AT_ONCE


def test_an_async_handler_takes_its_connection_at_its_first_statement(
    rig: Any,  # noqa: F811
) -> None:
    setup = rig(["ok", "ok"])
    results, _, _ = _run_async(setup, query_first)
    assert [r.kind for r in results] == [FINISHED, FINISHED]
    assert setup.effects() == {1: 1, 2: 1}
    assert setup.finished_count() == 2


def test_a_cancelled_async_handler_discards_the_connection_it_took(
    rig: Any,  # noqa: F811
) -> None:
    setup = rig(["ok"])
    kept: list[int] = []

    async def scenario(runtime: AsyncRuntime, tasks: list[Task]) -> list[Result]:
        SENT.clear()
        running = asyncio.ensure_future(runtime.run(tasks[0]))
        for _ in range(3000):  # until its statement was answered: its transaction is open
            if SENT:
                break
            await asyncio.sleep(0.01)
        assert SENT, "the handler's statement"
        idle_before = list(runtime._idle)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        kept.extend(id(conn) for conn in runtime._idle if conn not in idle_before)
        return []

    _run_async(setup, hang_after_a_statement, scenario)
    assert kept == [], "a connection whose state is unknown is not kept"
    assert SENT[0].invalidated, "it is discarded: the server rolls its transaction back"
    assert setup.effects() == {}
    assert setup.status(1) is not ExecutionStatus.FINISHED


# -- threads ---------------------------------------------------------------------------


def wait_quietly_on_a_thread(source: GroupItem, session: Session) -> Outcome:
    ARRIVALS[0].arrive(session)
    assert ARRIVALS[0].all_in.wait(30)
    session.add(GroupEffect(item_id=source.id))
    return Finished()


def test_threads_whose_handlers_send_no_statement_open_no_connection(
    rig: Any,  # noqa: F811
) -> None:
    setup = rig(["ok"] * AT_ONCE)
    runtime = Runtime(ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect)))
    runtime.end_together()
    reads = runtime.reads
    assert reads is not None
    tasks = [dataclasses.replace(task, handler=wait_quietly_on_a_thread) for task in setup.tasks]
    ARRIVALS[:] = [_Arrivals(len(tasks))]
    later: list[Result] = []
    done = threading.Semaphore(0)

    def deliver(result: Result) -> None:
        later.append(result)
        done.release()

    runtime.warm_up()
    opened = _connects(runtime.engine, [])
    try:
        for task in tasks:
            runtime.read_ahead(task)
        wait_until(lambda: all(w.ended for w in reads._wanted.values()), "the reads")
        with ThreadPoolExecutor(AT_ONCE) as pool:
            now = list(pool.map(lambda task: runtime.run_later(task, deliver), tasks))
        for result in now:
            if result is not None:
                deliver(result)
        for _ in tasks:
            assert done.acquire(timeout=30)
        counted = len(opened)
        held = list(runtime.held._by_id.values())
    finally:
        runtime.dispose()
    assert sorted(r.kind for r in later) == [FINISHED] * AT_ONCE
    assert ARRIVALS[0].bound == [False] * AT_ONCE, "none held a connection while it waited"
    if runtime.dialect.group_commit:
        assert all(h.opened() == [] for h in held), "no thread opened a connection"
        assert counted <= 1 + ENDING_AT_ONCE, counted  # the reading thread's and the endings'
    assert setup.effects() == {i: 1 for i in range(1, AT_ONCE + 1)}
    assert setup.finished_count() == AT_ONCE
