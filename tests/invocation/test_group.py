"""Group commit in a handler process (``invocation/group.py``), run in the test's own
process on claimed items of every database: each item's work and its fenced record
commit with the group or not at all, an item's failure touches only its own savepoint,
a lost claim commits nothing of its item (the group runs again, item by item), nothing
is visible to others before the group's COMMIT, and a handler that releases its
transaction is taken out of the group and run alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, Integer, String, create_engine, func, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, ExecutionStatus, Finished, Outcome, Unfinished
from dbworker.core.tasks import Result, ResultKind, Task, TaskKey
from dbworker.dialects import Owner, for_url
from dbworker.invocation import group
from dbworker.invocation.group import run_group
from dbworker.invocation.runtime import ChildConfig, Runtime

WORKER = "grouped"


class Base(DeclarativeBase):
    pass


class GroupItem(Base):
    __tablename__ = "group_items"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    mode: Mapped[str] = mapped_column(String(20))


class GroupEffect(Base):
    """One row per committed write of a handler (no unique key: doubles are counted)."""

    __tablename__ = "group_effects"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(Integer)


#: Item ids, one per handler call (the handler runs in this process).
CALLS: list[int] = []


def handle(source: GroupItem, session: Session) -> Outcome:
    CALLS.append(source.id)
    item_id, mode = source.id, source.mode
    if mode == "nothing":
        return Finished()
    if mode == "touch":
        source.mode = "touched"  # a change to flush, and nothing else
        return Finished()
    session.add(GroupEffect(item_id=item_id))
    session.flush()
    if mode == "raise":
        raise RuntimeError(f"item {item_id} raised on purpose")
    if mode == "rollback":
        session.rollback()  # allowed: its write above is gone, the next one commits
        session.add(GroupEffect(item_id=item_id))
    if mode == "unfinished":
        return Unfinished(delay=60.0)
    return Finished()


@dataclass
class Rig:
    engine: Engine
    coordinator: Coordinator
    runtime: Runtime
    tasks: list[Task]

    def effects(self) -> dict[int, int]:
        with Session(self.engine) as session:
            rows = session.execute(
                select(GroupEffect.item_id, func.count()).group_by(GroupEffect.item_id)
            ).all()
        return {item_id: count for item_id, count in rows}

    def status(self, item_id: int) -> ExecutionStatus | None:
        with Session(self.engine) as session:
            state = self.coordinator.workers[WORKER].state(session, item_id)
        return None if state is None else state["execution_status"]

    def finished_count(self) -> int:
        return sum(self.status(t.source_id) is ExecutionStatus.FINISHED for t in self.tasks)

    def take_over(self, item_id: int) -> None:
        """Another claim of ``item_id`` (a newer token) before its handler ends."""
        table = self.coordinator._registration(WORKER).table.table
        with self.engine.begin() as conn:
            conn.execute(
                update(table).where(table.c.source_id == item_id).values(token=table.c.token + 1)
            )


@pytest.fixture
def rig(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Sequence[str]], Rig]]:
    # Groups bounded by their count alone, whatever the machine's speed.
    monkeypatch.setattr(group, "GROUP_SECONDS", 3600.0)
    made: list[Rig] = []

    def build(modes: Sequence[str]) -> Rig:
        engine = create_engine(database_url)
        Base.metadata.create_all(engine)
        coordinator = Coordinator(sessionmaker(engine), database_url=database_url)
        coordinator.transactional_worker(name=WORKER, source=GroupItem)(handle)
        coordinator.create_worker_tables()
        with Session(engine) as session, session.begin():
            session.add_all(GroupItem(id=i, mode=m) for i, m in enumerate(modes, start=1))
        dialect = for_url(database_url)
        own = create_engine(database_url, **dialect.coordinator_engine_options())
        dialect.configure_engine(own)
        registration = coordinator._registration(WORKER)
        try:
            with own.begin() as conn:
                while dialect.discover(conn, registration.table):
                    pass
            with own.begin() as conn:
                claims = dialect.claim(
                    conn,
                    registration.table,
                    registration.eligible_query(),
                    len(modes),
                    300.0,
                    Owner.current(),
                )
        finally:
            own.dispose()
        tasks = sorted((registration.task(c) for c in claims), key=lambda t: t.source_id)
        assert [t.source_id for t in tasks] == list(range(1, len(modes) + 1))
        runtime = Runtime(ChildConfig(database_url, {}, type(dialect)))
        made.append(Rig(engine, coordinator, runtime, tasks))
        CALLS.clear()
        return made[-1]

    yield build
    for rig in made:
        rig.runtime.dispose()
        rig.engine.dispose()


def never(_key: TaskKey) -> bool:
    return False


def run_all(rig: Rig, withdrawn: Callable[[TaskKey], bool] = never) -> list[Result]:
    """Run every task as a handler process does: a group, then what is left."""
    results: list[Result] = []
    tasks = list(rig.tasks)
    while tasks:
        ran = run_group(rig.runtime, tasks, withdrawn)
        assert [r.task_key for r in ran] == [t.key for t in tasks[: len(ran)]]
        results.extend(ran)
        tasks = tasks[len(ran) :]
    return results


def test_a_group_commits_once_and_nothing_shows_before_its_commit(rig: Any) -> None:
    setup = rig(["ok"] * 6)
    seen_before_commit: list[int] = []

    def withdrawn(_key: TaskKey) -> bool:
        # Asked before each further item: the items before it ran, uncommitted.
        seen_before_commit.append(setup.finished_count())
        return False

    results = run_group(setup.runtime, setup.tasks, withdrawn)
    assert [r.kind for r in results] == [ResultKind.FINISHED] * 6
    assert seen_before_commit == [0] * 5, "another connection saw a grouped item early"
    assert setup.effects() == dict.fromkeys(range(1, 7), 1)
    assert setup.finished_count() == 6


def test_a_failing_item_rolls_back_only_its_own_work(rig: Any) -> None:
    setup = rig(["ok", "raise", "ok", "unfinished", "ok"])
    results = run_all(setup)
    assert [r.kind for r in results] == [
        ResultKind.FINISHED,
        ResultKind.FAILED,
        ResultKind.FINISHED,
        ResultKind.UNFINISHED,
        ResultKind.FINISHED,
    ]
    assert results[1].error is not None and "raised on purpose" in results[1].error
    assert setup.effects() == {1: 1, 3: 1, 4: 1, 5: 1}
    assert [setup.status(i) for i in range(1, 6)] == [
        ExecutionStatus.FINISHED,
        ExecutionStatus.FAILED,
        ExecutionStatus.FINISHED,
        ExecutionStatus.UNFINISHED,
        ExecutionStatus.FINISHED,
    ]
    assert CALLS == [1, 2, 3, 4, 5], "no handler ran twice"


@pytest.mark.parametrize(
    ("second", "calls"),
    [
        # The group's one FINISH matched two rows of three: nothing of it committed,
        # and each item ran again alone.
        ("ok", [1, 2, 3, 1, 2, 3]),
        # An UNFINISH is fenced at once: the group went on without it.
        ("unfinished", [1, 2, 3]),
    ],
)
def test_a_lost_claim_in_a_group_commits_nothing_of_that_item(
    rig: Any, second: str, calls: list[int]
) -> None:
    setup = rig(["ok", second, "ok"])
    setup.take_over(2)
    results = run_all(setup)
    assert [r.kind for r in results] == [ResultKind.FINISHED, ResultKind.LOST, ResultKind.FINISHED]
    assert setup.effects() == {1: 1, 3: 1}
    assert setup.status(2) is ExecutionStatus.WORKING
    assert calls == CALLS


def test_a_handler_that_releases_its_transaction_runs_alone(rig: Any) -> None:
    setup = rig(["ok", "rollback", "ok", "rollback", "ok"])
    results = run_all(setup)
    assert [r.kind for r in results] == [ResultKind.FINISHED] * 5
    # The first item committed in a group; the one that rolled back was stopped there,
    # its savepoint rolled back, and run again alone, as was everything after it
    # (its worker is no longer grouped in this process).
    assert CALLS == [1, 2, 2, 3, 4, 5]
    assert WORKER in setup.runtime.alone
    assert setup.effects() == dict.fromkeys(range(1, 6), 1)
    assert setup.finished_count() == 5


def test_a_withdrawn_task_ends_the_group_before_it(rig: Any) -> None:
    setup = rig(["ok"] * 4)
    third = setup.tasks[2].key
    results = run_group(setup.runtime, setup.tasks, lambda key: key == third)
    assert [r.task_key for r in results] == [t.key for t in setup.tasks[:2]]
    assert setup.effects() == {1: 1, 2: 1}
    assert CALLS == [1, 2]


def test_a_group_stops_growing_once_it_has_run_its_time(
    rig: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = rig(["ok"] * 3)
    monkeypatch.setattr(group, "GROUP_SECONDS", 0.0)
    sizes = []
    tasks = list(setup.tasks)
    while tasks:
        ran = run_group(setup.runtime, tasks, never)
        sizes.append(len(ran))
        tasks = tasks[len(ran) :]
    assert sizes == [1, 1, 1]
    assert setup.effects() == {1: 1, 2: 1, 3: 1}


def test_a_group_takes_at_most_its_count(rig: Any) -> None:
    setup = rig(["ok"] * (group.GROUP_MAX_ITEMS + 2))
    results = run_group(setup.runtime, setup.tasks, never)
    assert len(results) == group.GROUP_MAX_ITEMS
    assert setup.finished_count() == group.GROUP_MAX_ITEMS


def test_tasks_are_never_grouped_where_the_dialect_says_so(database_url: str) -> None:
    """Where the dialect declares neither group commit nor groups of lone finishes
    (``lone_finishes.py``), its tasks are all marked to run alone."""
    from dbworker.dialects import Claim

    coordinator = Coordinator(sessionmaker(create_engine(database_url)), database_url=database_url)
    coordinator.transactional_worker(name="grouped", source=GroupItem)(_finish)
    registration = coordinator._registration("grouped")
    task = registration.task(Claim(1, 7, 1, 0, 0))
    dialect = registration.dialect
    assert task.alone is (not (dialect.group_commit or dialect.groups_lone_finishes))


def test_a_coordinator_groups_where_its_server_allows(database_url: str) -> None:
    """What ``start()`` learns of the server decides (``Dialect.learn_server``): here no
    server is a Galera node, so each dialect groups as it declares."""
    engine = create_engine(database_url)
    dialect = for_url(database_url)
    try:
        with engine.connect() as conn:
            dialect.learn_server(conn)
    finally:
        engine.dispose()
    assert dialect.group_commit is dialect.supports_group_commit
    assert dialect.group_commit is (engine.dialect.name != "sqlite")


def _finish(item: GroupItem, session: Session) -> Finished:
    return Finished()
