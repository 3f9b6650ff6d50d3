"""Through a backlog, the scheduler discovers ahead of its claims while the executor has
no room for one, on every database: a round of a backlog waited for until a claim came
back short held that claim up by its own length, while every handler process emptied
its pipe."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from dbworker.core.tasks import Result, ResultKind, Task, TaskKey
from dbworker.core.timing import PollBackoff
from dbworker.executors.base import Executor
from dbworker.scheduling.loop import Scheduler

from .rig import scheduler_of

WORKER = "discovery_ahead"
BATCH = 4


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "discovery_ahead_rows"
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)


class _Busy(Executor):
    """Room for two tasks, then none: it keeps them until ``give_back``, which has them
    come back LOST (the scheduler then holds nothing, and may stop)."""

    uses_rows = False

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.given_back = False

    def start(self) -> None:
        pass

    def free_slots(self) -> int:
        return 0 if self.tasks or self.given_back else 2

    def submit(self, task: Task) -> None:
        self.tasks.append(task)

    def submit_all(self, tasks: Sequence[Task]) -> None:
        self.tasks.extend(tasks)

    def wait_handles(self) -> Sequence[Any]:
        return []

    def collect(self) -> list[Result]:
        if not self.given_back:
            return []
        held, self.tasks = self.tasks, []
        return [Result(task.key, ResultKind.LOST) for task in held]

    def give_back(self) -> None:
        self.given_back = True

    def kill(self, task_key: TaskKey) -> bool:
        return False

    def started(self, task_key: TaskKey) -> float | None:
        return None

    def shutdown(self) -> None:
        pass


@pytest.fixture
def scheduled(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Scheduler, _Busy, sa.Engine, sa.Table]]:
    busy = _Busy()
    backoff = PollBackoff(0.02, 0.05)
    with scheduler_of(database_url, Base, Row, WORKER, busy, backoff) as (scheduler, state, app):
        if not scheduler.dialect.discovers_ahead:
            pytest.skip(f"{type(scheduler.dialect).__name__} does not discover ahead")
        monkeypatch.setattr(type(scheduler.dialect), "discovery_batch", BATCH)
        # No sweeps (they would add every record there is): discovery's rounds alone.
        state.discovery.next_sweep = state.discovery.next_full_sweep = float("inf")
        try:
            yield scheduler, busy, app, state.worker.table.table
        finally:
            if scheduler.thread.is_alive():
                busy.give_back()
                scheduler.request_stop(kill_after=None)
                scheduler.thread.join(10)


def _records(app: sa.Engine, table: sa.Table) -> dict[str, int]:
    with app.connect() as conn:
        rows = conn.execute(sa.select(table.c.status, sa.func.count()).group_by(table.c.status))
        return {str(status): int(count) for status, count in rows}


def test_a_backlog_is_discovered_ahead_while_the_executor_has_no_room(
    scheduled: tuple[Scheduler, _Busy, sa.Engine, sa.Table],
) -> None:
    scheduler, busy, app, table = scheduled
    with app.begin() as conn:  # three rounds' worth, and one row more
        conn.execute(sa.insert(Row), [{"id": i} for i in range(1, 3 * BATCH + 2)])
    scheduler.start()
    deadline = time.monotonic() + 20
    wanted = {"working": 2, "pending": 3 * BATCH - 2}
    while _records(app, table) != wanted and time.monotonic() < deadline:
        scheduler.wake()  # a pass, as a handler process's result would bring
        time.sleep(0.02)
    # The first poll found a full round and claimed two; with no room for a claim since,
    # the next two rounds ran ahead, and then none: two rounds' worth wait unclaimed.
    assert _records(app, table) == wanted
    assert [task.source_id for task in busy.tasks] == [1, 2]
    time.sleep(0.2)
    scheduler.wake()
    time.sleep(0.1)
    assert _records(app, table) == wanted, "it discovered further than two rounds ahead"
