"""The asyncio executor's process starts a task sent ahead as soon as a handler
returns, while that handler's ending still commits (``multiplexed_child``), and the
coordinator counts such endings as holding no slot: otherwise the next tasks are not
claimed ahead until their results come back (``MultiplexedPool._busy``). Enough is
claimed ahead for every slot of the next wave, and a task that waits in the process
is handed to the runner to prepare (its row read ahead), and forgotten there once
withdrawn."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dbworker.core.tasks import Result, ResultKind, Task, task_message, task_payload
from dbworker.core.timing import AHEAD_PER_SLOT
from dbworker.executors import multiplexed, multiplexed_child
from dbworker.executors.children import Child
from dbworker.executors.multiplexed import MultiplexedPool
from dbworker.executors.multiplexed_child import (
    AHEAD,
    CANCELLED,
    STARTED,
    TOGETHER,
    Waiting,
    _LoopServer,
    _serve_threads,
)
from dbworker.executors.process import CANCEL, receive, send
from waiting import wait_until

from .test_batched_reads import _Process, _task

ROOM = 4


@contextlib.contextmanager
def one_process_pool(room: int, asyncio: bool) -> Iterator[tuple[MultiplexedPool, Child, Any]]:
    """A pool of one (stand-in) process with ``room`` slots, whose invocations are known
    to take 0.3 s (so tasks are claimed ahead too); the process's end of its pipe."""
    parent, child_end = multiprocessing.Pipe()
    executor = MultiplexedPool(room, runner=None, parent_pid=0, asyncio=asyncio)  # type: ignore[arg-type]
    child = Child(_Process(), parent)  # type: ignore[arg-type]
    child.ready = True
    executor._children.append(child)
    executor._room[id(parent)] = room
    executor._typical = 0.3
    try:
        yield executor, child, child_end
    finally:
        parent.close()
        child_end.close()


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[MultiplexedPool, Child]]:
    # A task ahead per slot once durations are known, whatever they are.
    monkeypatch.setattr(multiplexed, "CLAIM_AHEAD_SECONDS", 3600.0)
    with one_process_pool(ROOM, asyncio=True) as (executor, child, _):
        yield executor, child


def _receive(executor: MultiplexedPool, child: Child, message: Any) -> list[Result]:
    results: list[Result] = []
    executor._read(child, message, results)
    return results


CLAIMED_AHEAD = AHEAD_PER_SLOT * ROOM


def test_tasks_started_while_endings_commit_leave_room_to_claim_ahead(pool: Any) -> None:
    executor, child = pool
    running = [_task(n) for n in range(ROOM)]
    executor.submit_all(running)
    assert executor.free_slots() == CLAIMED_AHEAD, "every slot busy: tasks ahead for each"
    ahead = [_task(n) for n in range(ROOM, ROOM + CLAIMED_AHEAD)]
    executor.submit_all(ahead)
    assert executor.free_slots() == 0
    # Every handler returned: tasks sent ahead started in their slots while the
    # endings commit (their results not back yet).
    _receive(executor, child, (STARTED, [t.key for t in ahead[:ROOM]], None))
    assert len(child.tasks) == ROOM + CLAIMED_AHEAD
    assert executor.free_slots() == ROOM, "the next tasks are claimed ahead now"
    # The endings' results come back: nothing changes for the slots.
    for task in running:
        assert _receive(executor, child, Result(task.key, ResultKind.FINISHED, duration=0.3))
    assert executor.free_slots() == ROOM


def test_idle_slots_are_claimed_for_before_the_tasks_ahead(pool: Any) -> None:
    """After a quiet spell, the claim is for the idle slots alone: claimed with the
    tasks ahead, the first wave waited for the claim, the dispatch and the reads of
    two more; the scheduler claims those in its next pass."""
    executor, _child = pool
    assert executor.free_slots() == ROOM
    executor.submit_all([_task(n) for n in range(ROOM - 1)])
    assert executor.free_slots() == 1, "a slot is idle: it alone is claimed for"
    executor.submit_all([_task(ROOM - 1)])
    assert executor.free_slots() == CLAIMED_AHEAD


def test_a_wave_whose_starts_come_in_bursts_leaves_the_next_wave_claimed_ahead(
    pool: Any,
) -> None:
    """A wave's starts reach the scheduler in bursts, and it tops the tasks ahead up
    only once half their room is free: every slot must still find a task waiting at
    the next wave (one ahead per slot left some to wait for a claim)."""
    executor, child = pool
    numbers = iter(range(1000))

    def claim() -> None:
        executor.submit_all([_task(next(numbers)) for _ in range(executor.free_slots())])

    claim()  # the first wave
    claim()  # the tasks ahead, in the scheduler's next pass
    for _wave in range(3):
        waiting = [t for t in child.tasks if t.key in executor._queued]
        assert len(waiting) >= ROOM, "a slot would wait for a claim at this wave"
        # This wave's handlers return: the slots start tasks ahead, in two bursts.
        starting = waiting[:ROOM]
        for burst in (starting[: ROOM - 1], starting[ROOM - 1 :]):
            _receive(executor, child, (STARTED, [t.key for t in burst], None))
            claim()
        # The last wave's endings commit.
        ended = [t for t in child.tasks if t.key not in executor._queued][:ROOM]
        for task in ended:
            _receive(executor, child, Result(task.key, ResultKind.FINISHED, duration=0.3))
            claim()


class _Runner:
    """Runs each task as a handler that returns when told, then an ending that
    commits when told (``run_async``'s ``returned`` called in between)."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.handler_done: dict[int, asyncio.Event] = {}
        self.ending_done: dict[int, asyncio.Event] = {}
        self.prepared: list[int] = []
        self.forgotten: list[Any] = []

    async def run_async(self, task: Task, returned: Any = None) -> Result:
        self.started.append(task.source_id)
        await self.handler_done.setdefault(task.source_id, asyncio.Event()).wait()
        returned()
        await self.ending_done.setdefault(task.source_id, asyncio.Event()).wait()
        return Result(task.key, ResultKind.FINISHED)

    def prepare_waiting(self, task: Task) -> None:
        self.prepared.append(task.source_id)

    def forget_waiting(self, key: Any) -> None:
        self.forgotten.append(key)


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
        server.waiting.append(Waiting.of(task_message(first, payload)))
        server.waiting.append(Waiting.of((AHEAD, task_message(second, payload))))
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


def test_a_task_that_waits_for_a_slot_is_prepared_and_forgotten_once_withdrawn() -> None:
    """A task sent ahead that finds no slot free is handed to the runner to prepare
    (its row read ahead); one withdrawn while it waits is forgotten there."""

    async def scenario() -> None:
        parent, child_end = multiprocessing.Pipe()
        runner = _Runner()
        server = _LoopServer(child_end, runner, lag_warning=60.0)  # type: ignore[arg-type]
        server.capacity = 1
        loop = asyncio.get_running_loop()
        stopping: asyncio.Future[None] = loop.create_future()
        first, second, third = _task(1), _task(2), _task(3)
        payload = task_payload(first)
        send(parent, task_message(first, payload))
        send(parent, (AHEAD, task_message(second, payload)))
        send(parent, (AHEAD, task_message(third, payload)))
        server._read(loop, stopping)
        await _passes()
        assert runner.started == [1]
        assert runner.prepared == [2, 3], "the first one started at once"
        send(parent, (CANCEL, third.key))
        server._read(loop, stopping)
        await _passes()
        assert runner.forgotten == [third.key]
        assert (CANCELLED, third.key) in _received(parent)
        for number in (1, 2):
            runner.handler_done.setdefault(number, asyncio.Event()).set()
            runner.ending_done.setdefault(number, asyncio.Event()).set()
            await _passes()
        assert runner.started == [1, 2]
        assert runner.prepared == [2, 3], "nothing prepared twice"
        parent.close()
        child_end.close()

    asyncio.run(scenario())


class _ThreadsRunner:
    """Runs each task on its thread until told to return; records what it was told
    of the tasks that wait."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started: list[int] = []
        self.prepared: list[int] = []
        self.starting: list[int] = []
        self.forgotten: list[Any] = []

    def run_later(self, task: Task, later: Any) -> Result:
        self.started.append(task.source_id)
        assert self.release.wait(timeout=30)
        return Result(task.key, ResultKind.FINISHED)

    def prepare_waiting(self, task: Task) -> None:
        self.prepared.append(task.source_id)

    def prepare_start(self, task: Task) -> None:
        self.starting.append(task.source_id)

    def forget_waiting(self, key: Any) -> None:
        self.forgotten.append(key)


@contextlib.contextmanager
def threads_process(runner: Any, threads: int) -> Iterator[Any]:
    """A threads process's serving loop on ``threads`` threads for ``runner`` (whose
    ``release`` lets its tasks return), in a thread of this process: the coordinator's
    end of its pipe. Stopped as the coordinator stops it (``None``)."""
    parent, child_end = multiprocessing.Pipe()
    serving = threading.Thread(
        target=_serve_threads, args=(child_end, runner, threads), daemon=True
    )
    serving.start()
    try:
        yield parent
    finally:
        runner.release.set()
        send(parent, None)
        serving.join(timeout=30)
        parent.close()
        child_end.close()


def test_threads_a_task_sent_ahead_is_prepared_and_forgotten_once_withdrawn() -> None:
    runner = _ThreadsRunner()
    first, second, third = _task(1), _task(2), _task(3)
    payload = task_payload(first)
    with threads_process(runner, 1) as parent:
        send(parent, task_message(first, payload))
        send(parent, (AHEAD, task_message(second, payload)))
        send(parent, (AHEAD, task_message(third, payload)))
        send(parent, (CANCEL, third.key))
        assert parent.poll(30), "the withdrawn task is answered"
        assert receive(parent) == (CANCELLED, third.key)
        # The thread may not have started it yet.
        wait_until(lambda: runner.started, "the task that starts at once to start")
        assert runner.started == [1]
        assert runner.prepared == [2, 3], "only those sent ahead"
        assert runner.starting == [1], "the one that starts at once reads with others"
        assert runner.forgotten == [third.key]


def test_threads_messages_put_while_one_is_written_go_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The threads' starts and results go through one sending thread: what they put
    while it writes goes in its next write; once closed, each is written at once."""
    written: list[Any] = []
    writing = threading.Event()
    go = threading.Event()

    def fake_send(conn: Any, message: Any) -> None:
        writing.set()
        assert go.wait(timeout=30)
        written.append(message)

    monkeypatch.setattr(multiplexed_child, "send", fake_send)
    outbox = multiplexed_child._ThreadsOutbox(None)  # type: ignore[arg-type]
    outbox.put("first")
    assert writing.wait(timeout=30)
    outbox.put("second")
    outbox.put("third")
    go.set()
    outbox.close()
    assert written == ["first", (TOGETHER, ["second", "third"])]
    outbox.put("after")
    assert written[-1] == "after"
