"""A handler process SIGKILLed in the middle of a group of lone finishes (SQLite: items
that wrote nothing, whose FINISHes are recorded together after the group,
``invocation/lone_finishes.py``): none of the group's FINISHes was recorded, so the
coordinator still holds every item of it (their leases are far too long to run out
within the test), runs each again alone, and charges none of them with the crash; every
item ends FINISHED."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator, ExecutionStatus
from dbworker.dialects import for_url
from dbworker.executors import prefetch
from waiting import wait_until

from . import lone_finish_app as app

LONG_LEASE = 120.0
WAIT = 60.0
ITEMS = 600
EVERY = 5


@pytest.mark.slow
def test_a_child_killed_mid_group_runs_each_item_of_it_again_uncharged(
    engine: Engine, database_url: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialect = for_url(database_url)
    if dialect.supports_group_commit or not dialect.groups_lone_finishes:
        pytest.skip("this database groups in one transaction, or not at all (test_group_crash)")
    monkeypatch.setattr(prefetch, "GROUP_TYPICAL_SECONDS", 0.1)  # as test_group_crash
    coordinator = Coordinator(
        sessionmaker(engine),
        database_url=database_url,
        lease_seconds=LONG_LEASE,
        poll_seconds=0.05,
        max_poll_seconds=0.2,
    )
    app.register(coordinator, concurrency=1)
    app.Base.metadata.create_all(engine)
    coordinator.create_worker_tables()
    (workdir / app.URL).write_text(database_url)
    with Session(engine) as session, session.begin():
        session.add_all(
            app.LoneItem(
                id=i,
                mode=app.STOPS_MID_GROUP if i % EVERY == 0 else app.QUICK,
                workdir=str(workdir),
            )
            for i in range(1, ITEMS + 1)
        )
    worker = coordinator.workers[app.WORKER]

    def status(item_id: int) -> ExecutionStatus | None:
        with Session(engine) as session:
            state = worker.state(session, item_id)
        return None if state is None else state["execution_status"]

    stopped = workdir / app.STOPPED
    coordinator.start()
    try:
        wait_until(stopped.exists, "an item to stop in the middle of a group", WAIT)
        item, pid = (int(value) for value in stopped.read_text().split())
        previous = item - 1
        # The item before it ran in the same process and finished, but its FINISH is
        # not recorded: the group is in flight, and the coordinator has heard nothing.
        assert app.runs(workdir, previous)[-1] == pid
        assert status(previous) is ExecutionStatus.WORKING

        os.kill(pid, signal.SIGKILL)

        wait_until(
            lambda: all(status(i) is ExecutionStatus.FINISHED for i in range(1, ITEMS + 1)),
            "every item to finish",
            WAIT,
        )
    finally:
        coordinator.stop(timeout=0)
    # The killed group's items ran again, in another process.
    for item_id in (previous, item):
        pids = app.runs(workdir, item_id)
        assert len(pids) == 2 and pids[0] == pid and pids[1] != pid
    with Session(engine) as session:
        charged = {
            i: state["crashes"]
            for i in range(1, ITEMS + 1)
            if (state := worker.state(session, i)) is not None and state["crashes"]
        }
    assert not charged
