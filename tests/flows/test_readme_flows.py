"""Every flow of the README, as written, with real handler processes, on every backend.

Each test runs one coordinator whose handlers run in its persistent process pool
(``Coordinator.start()``). Tests wait for outcomes by polling the database with a
generous deadline and never assert on how long anything took.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from backends import as_pymysql
from dbworker import Coordinator, ExecutionStatus
from execution_reads import DEADLINE
from waiting import wait_until

from .app import (
    Item,
    Output,
    finish_handler,
    flaky_handler,
    prepare_handler,
    publish_handler,
    slow_handler,
    steps_handler,
)
from .support import Harness, harness

FINISHED, FAILED = ExecutionStatus.FINISHED, ExecutionStatus.FAILED


def enabled_in_id_order() -> Any:
    # The README's example eligible query.
    return select(Item).where(Item.enabled.is_(True)).order_by(Item.id)


# -- claim + Finished --------------------------------------------------------------------


def run_claim_and_finish(h: Harness, url: str | None = None) -> None:
    coordinator = h.coordinator(url)
    coordinator.transactional_worker(
        name="process", source=Item, eligible=enabled_in_id_order, concurrency=2
    )(finish_handler)
    ids = [1, 2, 3, 4]
    h.insert(*ids)
    coordinator.create_worker_tables()
    assert h.statuses(coordinator, "process", ids) == dict.fromkeys(ids)
    assert h.state(coordinator, "process", 1) is None

    finished = coordinator.has_execution_status(
        worker="process", source_id=Item.id, statuses=(FINISHED,)
    )
    outputs = select(func.count()).where(Output.item_id == Item.id).scalar_subquery()
    # One statement reads a row's writes and its status from one snapshot, so every
    # sample must show them together: FINISHED if and only if the handler's writes
    # (to the source row and to another table) are there.
    snapshot = select(Item.id, Item.result, Item.invocations, outputs, finished).order_by(Item.id)

    def all_finished_consistently() -> bool:
        with h.session_factory() as session:
            rows = session.execute(snapshot).all()
        for item_id, result, invocations, output_count, is_finished in rows:
            written = (result, invocations, output_count) == (f"done {item_id}", 1, 1)
            untouched = (result, invocations, output_count) == (None, 0, 0)
            assert (written and is_finished) or (untouched and not is_finished), rows
        return all(row[-1] for row in rows)

    coordinator.start()
    wait_until(
        all_finished_consistently,
        "every item FINISHED with its writes",
        timeout=DEADLINE,
        diagnose=coordinator.health,
    )
    coordinator.stop()

    assert h.statuses(coordinator, "process", ids) == dict.fromkeys(ids, FINISHED)
    for item_id in ids:
        state = h.state(coordinator, "process", item_id)
        assert state is not None
        assert state["execution_status"] is FINISHED
        assert state["error"] is None
        assert state["lease_expires_at"] is None
        assert h.runs("process", item_id) == 1


def test_rows_inserted_before_start_are_claimed_and_finished(h: Harness) -> None:
    run_claim_and_finish(h)


@pytest.mark.backends("mysql")
def test_mysql_flow_with_pymysql(database_url: str, tmp_path: Path) -> None:
    url = as_pymysql(database_url)
    with harness(url, tmp_path) as h:
        assert h.engine.dialect.driver == "pymysql"
        run_claim_and_finish(h, url)
        # The failure path too: the error is read from the driver's exception types.
        coordinator = h.coordinator(url)
        coordinator.transactional_worker(name="flaky", source=Item, concurrency=2)(flaky_handler)
        h.update(1, should_fail=True)
        coordinator.create_worker_tables()
        coordinator.start()
        h.wait_for_status(coordinator, "flaky", [2, 3, 4], FINISHED)
        h.wait_for_status(coordinator, "flaky", [1], FAILED)
        state = h.state(coordinator, "flaky", 1)
        assert state is not None and state["error"] is not None
        assert "ValueError: flaky item 1 failed" in state["error"]


# -- Unfinished --------------------------------------------------------------------------


def test_unfinished_invokes_again_from_the_beginning(h: Harness) -> None:
    coordinator = h.coordinator()
    coordinator.transactional_worker(name="steps", source=Item, concurrency=2)(steps_handler)
    unfinished_times = {1: 3, 2: 0, 3: 1}
    for item_id, n in unfinished_times.items():
        h.insert(item_id, unfinished_times=n)
    coordinator.create_worker_tables()
    coordinator.start()
    h.wait_for_status(coordinator, "steps", list(unfinished_times), FINISHED)

    items = h.items()
    for item_id, n in unfinished_times.items():
        # N invocations returned Unfinished() and one more returned Finished(); each
        # began at the top of the function ("B"), and each committed its writes.
        assert items[item_id].invocations == n + 1
        assert items[item_id].trace == "BU" * n + "BF"
        assert h.runs("steps", item_id) == n + 1


# -- failures and reset_failed -------------------------------------------------------------


def test_failure_is_recorded_rolled_back_and_only_rerun_after_reset(h: Harness) -> None:
    coordinator = h.coordinator()
    worker = coordinator.transactional_worker(name="flaky", source=Item, concurrency=2)
    worker(flaky_handler)
    h.insert(1, should_fail=True)
    h.insert(2)
    coordinator.create_worker_tables()
    coordinator.start()
    h.wait_for_status(coordinator, "flaky", [1], FAILED)
    h.wait_for_status(coordinator, "flaky", [2], FINISHED)

    state = h.state(coordinator, "flaky", 1)
    assert state is not None
    assert state["execution_status"] is FAILED
    assert state["error"] is not None
    assert "ValueError" in state["error"]
    assert "flaky item 1 failed on purpose" in state["error"]
    # The handler flushed its writes before raising; none of them committed.
    failed = h.item(1)
    assert (failed.result, failed.invocations) == (None, 0)
    with h.session_factory() as session:
        outputs = session.scalars(select(Output.item_id).order_by(Output.item_id)).all()
    assert outputs == [2]

    # Not run again: a row inserted after the failure (claimed in id order, so the
    # failed row is considered first) completes while the failed row stays put.
    h.insert(3)
    h.wait_for_status(coordinator, "flaky", [3], FINISHED)
    assert h.runs("flaky", 1) == 1
    assert h.status(coordinator, "flaky", 1) is FAILED

    with h.session_factory.begin() as session:
        assert coordinator.workers["flaky"].reset_failed(session, 2) is False  # FINISHED
        assert coordinator.workers["flaky"].reset_failed(session, 99) is False  # no record
    assert h.status(coordinator, "flaky", 2) is FINISHED

    h.update(1, should_fail=False)  # the cause, corrected
    with h.session_factory.begin() as session:
        assert coordinator.workers["flaky"].reset_failed(session, 1) is True
    h.wait_for_status(coordinator, "flaky", [1], FINISHED)

    assert h.runs("flaky", 1) == 2
    repaired = h.item(1)
    assert (repaired.result, repaired.invocations) == ("done 1", 1)
    state = h.state(coordinator, "flaky", 1)
    assert state is not None and state["error"] is None
    # A finished item is not reset, and a second reset of the same failure is a no-op.
    with h.session_factory.begin() as session:
        assert coordinator.workers["flaky"].reset_failed(session, 1) is False


# -- dependent workers ------------------------------------------------------------------------


def test_dependent_worker_waits_for_the_first_to_finish(h: Harness) -> None:
    coordinator = h.coordinator()
    coordinator.transactional_worker(
        name="prepare", source=Item, eligible=enabled_in_id_order, concurrency=2
    )(prepare_handler)

    def prepared() -> Any:
        return (
            select(Item)
            .where(
                coordinator.has_execution_status(
                    worker="prepare", source_id=Item.id, statuses=(FINISHED,)
                )
            )
            .order_by(Item.id)
        )

    coordinator.transactional_worker(name="publish", source=Item, eligible=prepared, concurrency=2)(
        publish_handler
    )
    h.insert(1, 4)
    h.insert(2, should_fail=True)  # its preparation fails
    h.insert(3, enabled=False)  # its preparation is held back
    coordinator.create_worker_tables()
    coordinator.start()

    h.wait_for_status(coordinator, "publish", [1, 4], FINISHED)
    h.wait_for_status(coordinator, "prepare", [2], FAILED)
    assert h.status(coordinator, "prepare", 3) is None
    assert h.statuses(coordinator, "publish", [2, 3]) == {2: None, 3: None}

    h.update(3, enabled=True)
    h.wait_for_status(coordinator, "publish", [3], FINISHED)

    items = h.items()
    for item_id in (1, 3, 4):
        # prepare's write commits with its FINISHED, so publish seeing it means
        # publish ran after prepare had finished.
        assert items[item_id].saw_prepared is True
        assert items[item_id].published is True
        assert h.runs("publish", item_id) == 1
    # Publishing row 3 came after row 2 failed, so row 2 was passed over for good.
    assert (items[2].published, items[2].saw_prepared) == (False, None)
    assert h.runs("publish", 2) == 0
    assert h.status(coordinator, "publish", 2) is None


# -- no enqueue -------------------------------------------------------------------------


def test_rows_inserted_or_enabled_after_start_are_picked_up(h: Harness) -> None:
    coordinator = h.coordinator()
    coordinator.transactional_worker(
        name="process", source=Item, eligible=enabled_in_id_order, concurrency=2
    )(finish_handler)
    h.insert(1, enabled=False)
    h.insert(6)
    coordinator.create_worker_tables()
    coordinator.start()

    h.insert(7, 8)
    h.wait_for_status(coordinator, "process", [6, 7, 8], FINISHED)
    # A key below every key seen so far, as when a transaction that took its key
    # before the coordinator started commits after larger keys were processed.
    h.insert(3)
    h.wait_for_status(coordinator, "process", [3], FINISHED)
    assert h.status(coordinator, "process", 1) is None

    h.update(1, enabled=True)
    h.wait_for_status(coordinator, "process", [1], FINISHED)
    assert [h.runs("process", i) for i in (1, 3, 6, 7, 8)] == [1, 1, 1, 1, 1]


# -- stop() ------------------------------------------------------------------------------


def test_stop_waits_for_the_running_handler_to_finish(h: Harness) -> None:
    coordinator = h.coordinator()
    # One slot, so the second item waits for it and shows that stop() claims nothing new.
    coordinator.transactional_worker(name="slow", source=Item, concurrency=1)(slow_handler)
    h.insert(1, sleep_seconds=2.0)
    h.insert(2)
    coordinator.create_worker_tables()
    coordinator.start()
    wait_until(lambda: h.runs("slow", 1) == 1, "the slow handler to start", timeout=DEADLINE)
    assert h.status(coordinator, "slow", 1) is ExecutionStatus.WORKING

    coordinator.stop()

    assert not coordinator.running
    assert h.status(coordinator, "slow", 1) is FINISHED
    assert h.item(1).result == "slept 1"
    assert h.status(coordinator, "slow", 2) is None
    assert h.runs("slow", 2) == 0


# -- has_execution_status in application queries ------------------------------------------------


def test_has_execution_status_in_an_application_query(h: Harness) -> None:
    coordinator: Coordinator = h.coordinator()
    coordinator.transactional_worker(
        name="flaky", source=Item, eligible=enabled_in_id_order, concurrency=2
    )(flaky_handler)
    h.insert(1, 3, 5)
    h.insert(2, should_fail=True)
    h.insert(4, enabled=False)  # never claimed: no execution record
    coordinator.create_worker_tables()
    coordinator.start()
    h.wait_for_status(coordinator, "flaky", [1, 3, 5], FINISHED)
    h.wait_for_status(coordinator, "flaky", [2], FAILED)

    def ids(*conditions: Any) -> list[int]:
        query = select(Item).where(*conditions).order_by(Item.id)
        with h.session_factory() as session:
            return [item.id for item in session.scalars(query).all()]

    def has(*statuses: ExecutionStatus) -> Any:
        return coordinator.has_execution_status(
            worker="flaky", source_id=Item.id, statuses=statuses
        )

    assert ids(has(FINISHED)) == [1, 3, 5]
    assert ids(has(FAILED)) == [2]
    assert ids(has(FINISHED, FAILED)) == [1, 2, 3, 5]
    assert ids(has(ExecutionStatus.WORKING, ExecutionStatus.UNFINISHED)) == []
    # Items without a record match no status, so they are exactly the negation's extra.
    assert ids(~has(FINISHED)) == [2, 4]
    assert ids(has(FINISHED), Item.id > 1) == [3, 5]
    # Any iterable of statuses will do.
    in_a_set = coordinator.has_execution_status(
        worker="flaky", source_id=Item.id, statuses={FINISHED}
    )
    assert ids(in_a_set) == [1, 3, 5]
