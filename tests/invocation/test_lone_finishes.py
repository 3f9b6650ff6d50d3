"""Groups of lone finishes (``invocation/lone_finishes.py``), run in the test's own
process on claimed items of every database (SQLite's handler processes use them; the
statement they end with is every dialect's): items that wrote nothing and finished are
recorded FINISHED together, once the group stops, and nothing of them shows before;
an item that wrote, failed or returned Unfinished ends in its turn as it would alone; a
claim lost meanwhile is LOST and left as it is; a failed statement leaves each item to
be recorded alone."""

from __future__ import annotations

from typing import Any

import pytest

from dbworker import ExecutionStatus
from dbworker.core.tasks import ResultKind, TaskKey
from dbworker.dialects import for_url
from dbworker.invocation import group
from dbworker.invocation.lone_finishes import run_lone_finishes

from .test_group import CALLS, never, rig  # noqa: F401 (the fixture)

WORKING = ExecutionStatus.WORKING
FINISHED = ExecutionStatus.FINISHED


@pytest.fixture(autouse=True)
def _reads_apart(database_url: str) -> None:
    if not for_url(database_url).source_read_apart:
        # Its handlers read their row in their own transaction: none ends holding
        # none, so there is no lone finish to put off.
        pytest.skip("this database reads the row in the handler's transaction")


def test_finishes_put_off_are_recorded_together_after_the_group(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"] * 4)
    seen: list[list[ExecutionStatus | None]] = []

    def look(_key: TaskKey) -> bool:
        # Before each later item: what the ones before it left committed.
        seen.append([setup.status(t.source_id) for t in setup.tasks])
        return False

    results = run_lone_finishes(setup.runtime, setup.tasks, look)
    assert [r.task_key for r in results] == [t.key for t in setup.tasks]
    assert [r.kind for r in results] == [ResultKind.FINISHED] * 4
    assert seen == [[WORKING] * 4] * 3, "a FINISH was recorded before the group's end"
    assert [setup.status(t.source_id) for t in setup.tasks] == [FINISHED] * 4
    assert CALLS == [1, 2, 3, 4]
    assert setup.runtime.deferred is None


def test_an_item_that_writes_fails_or_comes_back_later_ends_in_its_turn_and_the_group(
    rig: Any,  # noqa: F811
) -> None:
    """Its result is committed as alone, and goes back with the group's at once: a group
    stops after it (held back, a crash later in the group would run it again)."""
    setup = rig(["nothing", "ok", "nothing", "raise", "unfinished", "nothing"])
    first_before_second: list[ExecutionStatus | None] = []

    def look(key: TaskKey) -> bool:
        if key[1] == 2:
            first_before_second.append(setup.status(1))
        return False

    sizes, kinds = [], []
    tasks = list(setup.tasks)
    while tasks:
        ran = run_lone_finishes(setup.runtime, tasks, look)
        assert [r.task_key for r in ran] == [t.key for t in tasks[: len(ran)]]
        sizes.append(len(ran))
        kinds += [r.kind for r in ran]
        tasks = tasks[len(ran) :]
    assert sizes == [2, 2, 1, 1]
    assert kinds == [
        ResultKind.FINISHED,
        ResultKind.FINISHED,
        ResultKind.FINISHED,
        ResultKind.FAILED,
        ResultKind.UNFINISHED,
        ResultKind.FINISHED,
    ]
    assert first_before_second == [WORKING], "put off until its group's end"
    assert [setup.status(i) for i in (1, 2, 3, 6)] == [FINISHED] * 4
    assert setup.status(5) is ExecutionStatus.UNFINISHED
    assert setup.effects() == {2: 1, 5: 1}


def test_a_claim_lost_meanwhile_is_lost_and_left_as_it_is(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"] * 3)

    def take_over_second(key: TaskKey) -> bool:
        if key[1] == 3:
            setup.take_over(2)  # after its handler returned, before the FINISHes
        return False

    results = run_lone_finishes(setup.runtime, setup.tasks, take_over_second)
    assert [r.kind for r in results] == [ResultKind.FINISHED, ResultKind.LOST, ResultKind.FINISHED]
    assert [setup.status(i) for i in (1, 2, 3)] == [FINISHED, WORKING, FINISHED]


def test_a_failed_statement_leaves_each_item_to_be_recorded_alone(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setup = rig(["nothing"] * 3)
    dialect = setup.runtime.dialect

    def broken(*_args: Any) -> set[Any]:
        raise RuntimeError("the statement failed")

    monkeypatch.setattr(dialect, "finish_all_alone", broken)
    results = run_lone_finishes(setup.runtime, setup.tasks, never)
    assert [r.kind for r in results] == [ResultKind.FINISHED] * 3
    assert [setup.status(i) for i in (1, 2, 3)] == [FINISHED] * 3


def test_a_withdrawn_task_ends_the_group_before_it(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"] * 3)
    results = run_lone_finishes(setup.runtime, setup.tasks, lambda key: key[1] == 2)
    assert [r.task_key for r in results] == [setup.tasks[0].key]
    assert setup.status(1) is FINISHED and setup.status(2) is WORKING


def test_a_group_takes_at_most_its_count(rig: Any) -> None:  # noqa: F811
    setup = rig(["nothing"] * (group.GROUP_MAX_ITEMS + 2))
    results = run_lone_finishes(setup.runtime, setup.tasks, never)
    assert len(results) == group.GROUP_MAX_ITEMS
    assert setup.finished_count() == group.GROUP_MAX_ITEMS


def test_a_group_stops_growing_once_it_has_run_its_time(
    rig: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each group is the item it began with: the FINISH put off for it is recorded then,
    before the next item runs."""
    setup = rig(["nothing"] * 3)
    monkeypatch.setattr(group, "GROUP_SECONDS", 0.0)
    before_each: list[list[ExecutionStatus | None]] = []
    sizes = []
    tasks = list(setup.tasks)
    while tasks:
        before_each.append([setup.status(t.source_id) for t in setup.tasks])
        ran = run_lone_finishes(setup.runtime, tasks, never)
        sizes.append(len(ran))
        tasks = tasks[len(ran) :]
    assert sizes == [1, 1, 1]
    assert before_each == [
        [WORKING, WORKING, WORKING],
        [FINISHED, WORKING, WORKING],
        [FINISHED, FINISHED, WORKING],
    ]
    assert [setup.status(t.source_id) for t in setup.tasks] == [FINISHED] * 3
