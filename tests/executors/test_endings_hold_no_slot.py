"""The asyncio executor's process starts a task sent ahead as soon as a handler
returns, while that handler's ending still commits (``multiplexed_child``), and the
coordinator counts such endings as holding no slot: otherwise the next tasks are not
claimed ahead until their results come back (``MultiplexedPool._busy``)."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest

from dbworker.core.tasks import Result, ResultKind, Task, task_message, task_payload
from dbworker.executors import multiplexed
from dbworker.executors.children import Child
from dbworker.executors.multiplexed import MultiplexedPool
from dbworker.executors.multiplexed_child import STARTED, TOGETHER, _LoopServer

from .test_batched_reads import _Process, _task

ROOM = 4


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[MultiplexedPool, Child]]:
    # A task ahead per slot once durations are known, whatever they are.
    monkeypatch.setattr(multiplexed, "CLAIM_AHEAD_SECONDS", 3600.0)
    parent, child_end = multiprocessing.Pipe()
    executor = MultiplexedPool(ROOM, runner=None, parent_pid=0, asyncio=True)  # type: ignore[arg-type]
    child = Child(_Process(), parent)  # type: ignore[arg-type]
    child.ready = True
    executor._children.append(child)
    executor._room[id(parent)] = ROOM
    executor._typical = 0.3
    yield executor, child
    parent.close()
    child_end.close()


def _receive(executor: MultiplexedPool, child: Child, message: Any) -> list[Result]:
    results: list[Result] = []
    executor._read(child, message, results)
    return results


def test_tasks_started_while_endings_commit_leave_room_to_claim_ahead(pool: Any) -> None:
    executor, child = pool
    running = [_task(n) for n in range(ROOM)]
    executor.submit_all(running)
    assert executor.free_slots() == ROOM, "every slot busy: a task ahead per slot"
    ahead = [_task(n) for n in range(ROOM, 2 * ROOM)]
    executor.submit_all(ahead)
    assert executor.free_slots() == 0
    # Every handler returned: the tasks sent ahead started in their slots while the
    # endings commit (their results not back yet).
    _receive(executor, child, (STARTED, [t.key for t in ahead], None))
    assert len(child.tasks) == 2 * ROOM
    assert executor.free_slots() == ROOM, "the next tasks are claimed ahead now"
    # The endings' results come back: nothing changes for the slots.
    for task in running:
        assert _receive(executor, child, Result(task.key, ResultKind.FINISHED, duration=0.3))
    assert executor.free_slots() == ROOM


class _Runner:
    """Runs each task as a handler that returns when told, then an ending that
    commits when told (``run_async``'s ``returned`` called in between)."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.handler_done: dict[int, asyncio.Event] = {}
        self.ending_done: dict[int, asyncio.Event] = {}

    async def run_async(self, task: Task, returned: Any = None) -> Result:
        self.started.append(task.source_id)
        await self.handler_done.setdefault(task.source_id, asyncio.Event()).wait()
        returned()
        await self.ending_done.setdefault(task.source_id, asyncio.Event()).wait()
        return Result(task.key, ResultKind.FINISHED)


async def _passes() -> None:
    """Let the event loop run what is ready (no I/O here: a few passes do it)."""
    for _ in range(10):
        await asyncio.sleep(0)


def _received(conn: Any) -> list[Any]:
    """Every message waiting on ``conn``, those sent together taken apart."""
    messages: list[Any] = []
    while conn.poll():
        message = conn.recv()
        together = isinstance(message, tuple) and message[0] == TOGETHER
        messages.extend(message[1] if together else [message])
    return messages


def test_a_slot_starts_its_next_task_when_the_handler_returns() -> None:
    async def scenario() -> None:
        parent, child_end = multiprocessing.Pipe()
        runner = _Runner()
        server = _LoopServer(child_end, runner, lag_warning=60.0)  # type: ignore[arg-type]
        server.capacity = 1
        first, second = _task(1), _task(2)
        payload = task_payload(first)
        server.waiting.extend([(task_message(first, payload), False)])
        server.waiting.extend([(task_message(second, payload), True)])
        server._start_waiting(asyncio.get_running_loop())
        await _passes()
        assert runner.started == [1], "one slot"
        runner.handler_done.setdefault(1, asyncio.Event()).set()
        await _passes()
        assert runner.started == [1, 2], "started while the first one's ending commits"
        # No result before the first one's ending committed.
        assert _received(parent) == [(STARTED, [second.key], None)]
        runner.ending_done.setdefault(1, asyncio.Event()).set()
        await _passes()
        assert _received(parent) == [Result(first.key, ResultKind.FINISHED)]
        runner.handler_done.setdefault(2, asyncio.Event()).set()
        runner.ending_done.setdefault(2, asyncio.Event()).set()
        await _passes()
        assert _received(parent) == [Result(second.key, ResultKind.FINISHED)]
        parent.close()
        child_end.close()

    asyncio.run(scenario())
