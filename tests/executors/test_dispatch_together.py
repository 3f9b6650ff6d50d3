"""What the coordinator sends a threads or asyncio process in one dispatch goes in one
write (``MultiplexedPool._dispatch``), and the process decodes every task of it, and
asks for their rows, before a thread is woken to start one (``multiplexed_child``):
sent one by one, a wave's tasks reached a threads process over 25-50 ms, each read
while the threads started by the ones before held the GIL."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dbworker.core.tasks import Result, ResultKind, Task, task_message, task_payload
from dbworker.executors.multiplexed import MultiplexedPool
from dbworker.executors.multiplexed_child import (
    AHEAD,
    CANCELLED,
    TOGETHER,
    _LoopServer,
)
from dbworker.executors.process import CANCEL, receive, send
from waiting import wait_until

from .test_batched_reads import _task
from .test_endings_hold_no_slot import _passes, _Runner, one_process_pool, threads_process

ROOM = 3


@pytest.fixture
def pool() -> Iterator[tuple[MultiplexedPool, Any]]:
    with one_process_pool(ROOM, asyncio=False) as (executor, _, child_end):
        yield executor, child_end


def _writes(conn: Any) -> list[Any]:
    writes = []
    while conn.poll(0.2):
        writes.append(conn.recv())
    return writes


def test_a_dispatch_sends_a_process_its_tasks_in_one_write(pool: Any) -> None:
    executor, child_end = pool
    tasks = [_task(n) for n in range(ROOM + 2)]
    executor.submit_all(tasks)
    writes = _writes(child_end)
    assert len(writes) == 1, "one write for the whole dispatch"
    kind, messages = writes[0]
    assert kind == TOGETHER
    payload = task_payload(tasks[0])
    starting = [task_message(t, payload) for t in tasks[:ROOM]]
    ahead = [(AHEAD, task_message(t, payload)) for t in tasks[ROOM:]]
    assert messages == starting + ahead, "the free slots' first, then those ahead"
    executor.submit_all([_task(99)])
    (alone,) = _writes(child_end)
    assert alone == (AHEAD, task_message(_task(99), payload)), "a lone task as itself"


class _ThreadsRunner:
    """Notes, as each task starts, how many tasks had been handed to it to prepare;
    preparing a task after the first gives the GIL away (a thread woken meanwhile
    would start then)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prepared = 0
        self.seen_at_start: list[int] = []
        self.release = threading.Event()

    def prepare_start(self, task: Task) -> None:
        if self.prepared:
            time.sleep(0.02)
        with self.lock:
            self.prepared += 1

    def prepare_waiting(self, task: Task) -> None:
        self.prepare_start(task)

    def run_later(self, task: Task, later: Any) -> Result:
        with self.lock:
            self.seen_at_start.append(self.prepared)
        assert self.release.wait(timeout=30)
        return Result(task.key, ResultKind.FINISHED)

    def forget_waiting(self, key: Any) -> None:
        pass


def test_threads_prepare_every_task_of_a_write_before_one_starts() -> None:
    runner = _ThreadsRunner()
    count = 4
    tasks = [_task(n) for n in range(count)]
    payload = task_payload(tasks[0])
    with threads_process(runner, count) as parent:
        send(parent, (TOGETHER, [task_message(t, payload) for t in tasks]))
        wait_until(lambda: len(runner.seen_at_start) == count, "every task to start")
        assert runner.seen_at_start == [count] * count


def test_threads_a_cancel_applies_to_the_tasks_that_arrived_before_it() -> None:
    runner = _ThreadsRunner()
    first, second = _task(1), _task(2)
    payload = task_payload(first)
    with threads_process(runner, 1) as parent:
        write = [
            task_message(first, payload),
            (AHEAD, task_message(second, payload)),
            (CANCEL, second.key),
        ]
        send(parent, (TOGETHER, write))
        assert parent.poll(30)
        assert receive(parent) == (CANCELLED, second.key)


def test_an_event_loop_takes_the_tasks_of_one_write_apart() -> None:
    async def scenario() -> None:
        parent, child_end = multiprocessing.Pipe()
        runner = _Runner()
        server = _LoopServer(child_end, runner, lag_warning=60.0)  # type: ignore[arg-type]
        server.capacity = 2
        loop = asyncio.get_running_loop()
        tasks = [_task(n) for n in (1, 2, 3)]
        payload = task_payload(tasks[0])
        messages = [task_message(t, payload) for t in tasks[:2]]
        send(parent, (TOGETHER, [*messages, (AHEAD, task_message(tasks[2], payload))]))
        server._read(loop, loop.create_future())
        await _passes()
        assert runner.started == [1, 2]
        assert runner.prepared == [3]
        for number in (1, 2, 3):
            runner.handler_done.setdefault(number, asyncio.Event()).set()
            runner.ending_done.setdefault(number, asyncio.Event()).set()
        await _passes()
        parent.close()
        child_end.close()

    asyncio.run(scenario())
