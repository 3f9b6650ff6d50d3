"""The asyncio executor's invocations end together and read their rows together
(``invocation/together.py``, ``invocation/reading.py``), run on every database in the
test's own event loop as a handler process runs them: handlers that return holding no
transaction commit in one transaction, a savepoint each, each exactly once (where
the database groups commits: not SQLite, whose one writer gains nothing); a flush
that fails is that item's failure only; a claim lost before the batch's COMMIT
commits nothing of the batch, whose items run again alone (the lost one finds its
claim spent); a handler that holds a transaction ends alone; a burst of starts reads
its rows in one statement."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from dbworker import ExecutionStatus, Finished, Outcome, Unfinished
from dbworker.core.tasks import Result, ResultKind
from dbworker.invocation import together
from dbworker.invocation.async_runtime import AsyncRuntime
from dbworker.invocation.loading import SourceLoader
from dbworker.invocation.runtime import ChildConfig, Runtime

from .test_group import WORKER, GroupEffect, GroupItem, Rig, rig  # noqa: F401  (the fixture)

FINISHED, FAILED, LOST = ResultKind.FINISHED, ResultKind.FAILED, ResultKind.LOST


class Gate:
    """Lets the handlers return once ``expected`` of them have started (so that their
    endings come together); open for good afterwards (runs again pass at once)."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrived = 0
        self.open = asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived >= self.expected:
            self.open.set()
        await self.open.wait()


GATE: list[Gate] = []
CALLS: list[int] = []


async def handle(source: GroupItem, session: AsyncSession) -> Outcome:
    CALLS.append(source.id)
    await GATE[0].wait()
    item_id, mode = source.id, source.mode
    if mode == "nothing":
        return Finished()
    if mode == "bad":
        session.add(GroupEffect(item_id=None))  # NOT NULL: its flush fails
        return Finished()
    session.add(GroupEffect(item_id=item_id))
    if mode == "flush":
        await session.flush()  # it holds a transaction from here on
    if mode == "unfinished":
        return Unfinished(delay=60.0)
    return Finished()


def _together(setup: Rig) -> bool:
    """Whether the database ends invocations together (``Dialect.group_commit``)."""
    return setup.runtime.dialect.group_commit


def _skip_alone(setup: Rig) -> None:
    if not _together(setup):
        pytest.skip(f"{type(setup.runtime.dialect).__name__} ends each invocation alone")


def run_together(
    setup: Rig, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Result], list[list[int]], list[int]]:
    """Run every task of ``setup`` at once on one event loop, as the asyncio executor's
    process does; the results, the batches of endings (source ids) and the sizes of
    the reads of several rows."""
    batches: list[list[int]] = []
    reads: list[int] = []
    end_together = together.end_together
    load_many = SourceLoader.load_many_apart

    def recorded(dialect: Any, conn: Any, partings: Sequence[together.Parting]) -> Any:
        batches.append([p.task.source_id for p in partings])
        return end_together(dialect, conn, partings)

    def read_many(loader: SourceLoader, wanted: Any, read: Any) -> Any:
        reads.append(len(wanted))
        return load_many(loader, wanted, read)

    monkeypatch.setattr(together, "end_together", recorded)
    monkeypatch.setattr(SourceLoader, "load_many_apart", read_many)
    tasks = [dataclasses.replace(task, handler=handle) for task in setup.tasks]
    config = ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect))

    async def main() -> list[Result]:
        GATE[:] = [Gate(len(tasks))]
        runtime = AsyncRuntime(config, capacity=len(tasks))
        try:
            return list(await asyncio.gather(*(runtime.run(task) for task in tasks)))
        finally:
            await runtime.dispose()

    CALLS.clear()
    return asyncio.run(main()), batches, reads


def test_handlers_that_hold_no_transaction_end_together_each_exactly_once(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["ok", "ok", "nothing", "ok", "unfinished", "ok"])
    results, batches, reads = run_together(setup, monkeypatch)
    assert [r.kind for r in results] == [FINISHED] * 4 + [ResultKind.UNFINISHED, FINISHED]
    assert setup.effects() == {1: 1, 2: 1, 4: 1, 5: 1, 6: 1}
    assert [setup.status(i) for i in range(1, 7)] == [ExecutionStatus.FINISHED] * 4 + [
        ExecutionStatus.UNFINISHED,
        ExecutionStatus.FINISHED,
    ]
    if not _together(setup):
        assert batches == [], "each ends alone"
    else:
        assert sorted(i for batch in batches for i in batch) == list(range(1, 7))
        assert max(len(batch) for batch in batches) > 1, batches
    assert sorted(CALLS) == list(range(1, 7)), "no handler ran twice"
    # The rows of the burst were read together too.
    assert reads and max(reads) > 1, reads


def test_a_failing_flush_in_a_batch_is_that_items_failure_only(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["ok", "ok", "bad", "ok", "ok"])
    _skip_alone(setup)
    results, batches, _ = run_together(setup, monkeypatch)
    assert [r.kind for r in results] == [FINISHED, FINISHED, FAILED, FINISHED, FINISHED]
    (batch,) = [b for b in batches if 3 in b]
    assert len(batch) > 1, "the failing item ended in a batch with others"
    assert setup.effects() == {1: 1, 2: 1, 4: 1, 5: 1}
    assert setup.status(3) is ExecutionStatus.FAILED
    assert setup.finished_count() == 4
    assert sorted(CALLS) == list(range(1, 6)), "no handler ran twice"


@pytest.mark.parametrize("failing", [False, True], ids=["inserted", "insert-failed"])
def test_a_batch_of_plain_inserts_ends_with_no_savepoint_unless_its_insert_fails(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    failing: bool,
) -> None:
    """The common batch is BEGIN, one INSERT, the FINISHes, COMMIT; a failing INSERT
    rolls it back and the batch ends again a savepoint each, where the failure is its
    own item's (as in the test above)."""
    setup = rig(["ok", "ok", "bad" if failing else "ok", "ok", "ok"])
    _skip_alone(setup)
    savepoints: list[int] = []
    begin_nested = Connection.begin_nested

    def counted(conn: Connection) -> Any:
        savepoints.append(1)
        return begin_nested(conn)

    monkeypatch.setattr(Connection, "begin_nested", counted)
    results, batches, _ = run_together(setup, monkeypatch)
    (batch,) = [b for b in batches if 3 in b]
    assert len(batch) > 1, batches
    if failing:
        assert savepoints, "the batch ended again a savepoint each"
        assert [r.kind for r in results] == [FINISHED, FINISHED, FAILED, FINISHED, FINISHED]
        assert setup.effects() == {1: 1, 2: 1, 4: 1, 5: 1}
    else:
        assert savepoints == []
        assert [r.kind for r in results] == [FINISHED] * 5
        assert setup.effects() == {i: 1 for i in range(1, 6)}
    assert sorted(CALLS) == list(range(1, 6)), "no handler ran twice"


def test_a_lost_claim_in_a_batch_commits_nothing_of_it_and_its_items_run_again_alone(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["ok"] * 5)
    _skip_alone(setup)
    setup.take_over(3)
    results, batches, _ = run_together(setup, monkeypatch)
    assert [r.kind for r in results] == [FINISHED, FINISHED, LOST, FINISHED, FINISHED]
    assert setup.effects() == {1: 1, 2: 1, 4: 1, 5: 1}
    assert setup.status(3) is ExecutionStatus.WORKING
    (lost_with,) = [b for b in batches if 3 in b]
    assert len(lost_with) > 1
    # Every item of the failed batch ran again, alone; the others once.
    assert sorted(CALLS) == sorted([*range(1, 6), *lost_with])


def test_a_handler_that_holds_a_transaction_ends_alone(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["ok", "flush", "ok", "flush"])
    _skip_alone(setup)
    results, batches, _ = run_together(setup, monkeypatch)
    assert [r.kind for r in results] == [FINISHED] * 4
    assert sorted(i for batch in batches for i in batch) == [1, 3]
    assert setup.effects() == dict.fromkeys(range(1, 5), 1)
    assert setup.finished_count() == 4


def handle_sync(source: GroupItem, session: Session) -> Outcome:
    item_id, mode = source.id, source.mode
    session.rollback()  # it releases its transaction, as an I/O-bound handler should
    CALLS.append(item_id)
    if mode == "flush":
        session.add(GroupEffect(item_id=item_id))
        session.flush()  # it holds a transaction from here on
        return Finished()
    session.add(GroupEffect(item_id=None if mode == "bad" else item_id))
    return Finished()


def run_on_threads(
    setup: Rig, monkeypatch: pytest.MonkeyPatch, alone: int = 0
) -> tuple[list[Result | None], dict[Any, Result], list[list[int]]]:
    """Run every task of ``setup`` at once on threads, as the threads executor's process
    does (``alone``: how many end on their own thread); what each thread returned, the
    results handed over later by key, and the batches of endings (source ids)."""
    runtime = Runtime(ChildConfig(str(setup.engine.url), {}, type(setup.runtime.dialect)))
    # One batch at a time: the first ending's, alone, then all the others'.
    endings = runtime.endings = together.ThreadEndings(
        lambda: runtime.dialect, lambda: runtime.engine.connect(), runtime.run, at_once=1
    )
    batches: list[list[int]] = []
    end_together = together.end_together
    handed = len(setup.tasks) - alone

    def recorded(dialect: Any, conn: Any, batch: Sequence[together.Parting]) -> Any:
        # The first batch waits until every other ending was handed over.
        deadline = time.monotonic() + 30
        while not batches and len(endings._waiting) < handed - len(batch):
            assert time.monotonic() < deadline, "the other endings were never handed over"
            time.sleep(0.01)
        batches.append([p.task.source_id for p in batch])
        return end_together(dialect, conn, batch)

    monkeypatch.setattr(together, "end_together", recorded)
    tasks = [dataclasses.replace(task, handler=handle_sync) for task in setup.tasks]
    later: list[Result] = []
    arrived = threading.Semaphore(0)

    def deliver(result: Result) -> None:
        later.append(result)
        arrived.release()

    CALLS.clear()
    try:
        with ThreadPoolExecutor(len(tasks)) as pool:
            now = list(pool.map(lambda task: runtime.run_later(task, deliver), tasks))
        for _ in range(handed):
            assert arrived.acquire(timeout=30), "a handed-over ending never reported"
    finally:
        runtime.dispose()
    assert all(r.duration is not None for r in later)
    return now, {r.task_key: r for r in later}, batches


def test_threads_hand_their_endings_over_and_they_commit_together(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["ok", "ok", "bad", "ok", "flush", "ok"])
    _skip_alone(setup)
    now, later, batches = run_on_threads(setup, monkeypatch, alone=1)
    # Only the one holding a transaction ended on its own thread.
    assert [i for i, r in enumerate(now, start=1) if r is not None] == [5]
    assert [later[t.key].kind for t in setup.tasks if t.source_id != 5] == [
        FINISHED,
        FINISHED,
        FAILED,
        FINISHED,
        FINISHED,
    ]
    assert sorted(i for b in batches for i in b) == [1, 2, 3, 4, 6], batches
    assert max(len(b) for b in batches) > 1, batches
    assert setup.effects() == {1: 1, 2: 1, 4: 1, 5: 1, 6: 1}
    assert setup.status(3) is ExecutionStatus.FAILED
    assert setup.finished_count() == 5
    assert sorted(CALLS) == list(range(1, 7)), "no handler ran twice"


def test_a_lost_claim_in_a_threads_batch_runs_its_items_again_alone(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["ok"] * 4)
    _skip_alone(setup)
    setup.take_over(3)
    now, later, batches = run_on_threads(setup, monkeypatch)
    assert now == [None] * 4
    assert [later[t.key].kind for t in setup.tasks] == [FINISHED, FINISHED, LOST, FINISHED]
    assert setup.effects() == {1: 1, 2: 1, 4: 1}
    assert setup.status(3) is ExecutionStatus.WORKING
    # Every item of the failed batch ran again, alone, and reported from there.
    (lost_with,) = [b for b in batches if 3 in b]
    assert sorted(CALLS) == sorted([*range(1, 5), *lost_with])
