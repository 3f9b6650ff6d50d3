"""Source rows read with the claim (``Task.row``), on every database: a task claimed
while its worker has nothing in flight carries its row to the pool, the threads and the
event loop's processes; tasks claimed while others are in flight carry none (they may
wait, and are read when they start or on arrival); a row crosses the pipe with its
task. (Its use in the handler process: ``tests/invocation/test_task_rows.py``.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from dbworker import ExecutionStatus
from dbworker.core.tasks import Task, task_from_message, task_message, task_payload
from dbworker.executors.multiplexed import MultiplexedPool
from dbworker.executors.pool import ProcessPool
from dbworker.invocation.loading import SourceLoader

from . import app, async_app
from .support import Rig

FINISHED = ExecutionStatus.FINISHED


#: Each executor that takes rows with claims, its class and its handler.
TAKING_ROWS: dict[str, tuple[type[Any], Any]] = {
    "pool": (ProcessPool, app.handle),
    "threads": (MultiplexedPool, app.handle),
    "asyncio": (MultiplexedPool, async_app.handle),
}


def _submitted(monkeypatch: pytest.MonkeyPatch, executor: type[Any]) -> list[tuple[Any, Any]]:
    """(source id, row) of every task ``executor`` is given from now on."""
    sent: list[tuple[Any, Any]] = []
    submit_all = executor.submit_all

    def recorded(self: Any, tasks: Sequence[Task]) -> None:
        sent.extend((task.source_id, task.row) for task in tasks)
        submit_all(self, tasks)

    monkeypatch.setattr(executor, "submit_all", recorded)
    return sent


@pytest.mark.parametrize("executor", sorted(TAKING_ROWS))
def test_a_task_claimed_while_its_worker_is_quiet_carries_its_row(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    kind, handler = TAKING_ROWS[executor]
    sent = _submitted(monkeypatch, kind)
    coordinator = rig.coordinator(executor, concurrency=2, handler=handler)
    coordinator.start()
    (first,) = rig.add("finish")
    rig.wait_status(coordinator, [first], FINISHED)
    assert sent == [(first, (first, "finish", str(rig.workdir)))]
    # While one is in flight (held at its gate), those claimed carry none.
    (gated,) = rig.add("gate")
    rig.wait_status(coordinator, [gated], ExecutionStatus.WORKING)
    (later,) = rig.add("finish")
    rig.wait_status(coordinator, [later], FINISHED)
    (app.gate_path(rig.workdir, gated, 1)).write_text("")
    rig.wait_status(coordinator, [gated], FINISHED)
    assert [row for source_id, row in sent if source_id == later] == [None]
    assert sorted(effect.item_id for effect in rig.effects()) == sorted([first, gated, later])


def test_a_row_crosses_the_pipe_with_its_task() -> None:
    task = Task("w", 7, 3, 1, 0, print, object, row=(7, "plan", "dir"))
    decoded = task_from_message(task_message(task, task_payload(task)))
    assert isinstance(decoded, Task)
    assert decoded.row == (7, "plan", "dir")
    bare = task_from_message(task_message(dataclasses.replace(task, row=None), task_payload(task)))
    assert isinstance(bare, Task)
    assert bare.row is None


def test_a_failed_read_of_rows_never_fails_the_claim(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sent = _submitted(monkeypatch, ProcessPool)
    asked: list[Any] = []

    def failing(self: SourceLoader, keys: Any, conn: Any) -> Any:
        asked.append(list(keys))
        raise ValueError("a column type that cannot be read here")

    monkeypatch.setattr(SourceLoader, "rows", failing)
    coordinator = rig.coordinator("pool", concurrency=2)
    coordinator.start()
    (first,) = rig.add("finish")
    rig.wait_status(coordinator, [first], FINISHED)
    (second,) = rig.add("finish")
    rig.wait_status(coordinator, [second], FINISHED)
    assert sent == [(first, None), (second, None)]
    assert asked == [[first]], "not asked again after an error that is not transient"
    assert "reading source rows with its claims failed" in caplog.text
    assert sorted(effect.item_id for effect in rig.effects()) == [first, second]
