"""A handler process SIGKILLed in the middle of a group (several items in one
transaction, ``invocation/group.py``): none of the group committed, so every item of
it runs again and each item's effect commits exactly once; nothing of the group was
reported before its commit, so the coordinator still holds every item of it (their
leases are far too long to run out within the test), and the items are run again
alone without charging any of them with the crash."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator, ExecutionStatus
from dbworker.dialects import for_url
from dbworker.executors import prefetch
from topologies.pgbouncer import listen_url
from waiting import wait_until

from . import group_app

#: Far longer than the test: an item run again can only have been handed out again by
#: the coordinator that held it, never taken over after its lease ran out.
LONG_LEASE = 120.0
WAIT = 60.0
#: Enough short items for the pool to measure them and start grouping, with an item
#: that may stop mid-group every few.
ITEMS = 600
EVERY = 5


def committed_effects(engine: Engine) -> dict[int, list[tuple[int, int]]]:
    """Committed effects per item: (run, pid) of each."""
    found: dict[int, list[tuple[int, int]]] = {}
    query = select(
        group_app.GroupEffect.item_id, group_app.GroupEffect.run, group_app.GroupEffect.pid
    )
    with Session(engine) as session:
        for item_id, run, pid in session.execute(query).all():
            found.setdefault(item_id, []).append((run, pid))
    return found


@pytest.mark.slow
def test_a_child_killed_mid_group_runs_each_item_of_it_again_and_commits_each_once(
    engine: Engine, database_url: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not for_url(database_url).supports_group_commit:
        pytest.skip("this database never groups (Dialect.supports_group_commit)")
    # Groups form once items typically take at most GROUP_TYPICAL_SECONDS: on a loaded
    # machine (CI's three workers on two cores) MariaDB's no-op items took longer, no
    # group ever formed, and the test waited for one in vain. What is under test is a
    # group's crash, not when grouping starts.
    monkeypatch.setattr(prefetch, "GROUP_TYPICAL_SECONDS", 0.1)
    coordinator = Coordinator(
        sessionmaker(engine),
        database_url=database_url,
        lease_seconds=LONG_LEASE,
        poll_seconds=0.05,
        max_poll_seconds=0.2,
        listen_url=listen_url(database_url),
    )
    group_app.register(coordinator, concurrency=1)
    group_app.Base.metadata.create_all(engine)
    coordinator.create_worker_tables()
    (workdir / group_app.URL).write_text(database_url)
    with Session(engine) as session, session.begin():
        session.add_all(
            group_app.GroupItem(
                id=i,
                mode=group_app.STOPS_MID_GROUP if i % EVERY == 0 else group_app.QUICK,
                workdir=str(workdir),
            )
            for i in range(1, ITEMS + 1)
        )
    worker = coordinator.workers[group_app.WORKER]

    def status(item_id: int) -> ExecutionStatus | None:
        with Session(engine) as session:
            state = worker.state(session, item_id)
        return None if state is None else state["execution_status"]

    stopped = workdir / group_app.STOPPED
    coordinator.start()
    try:
        wait_until(stopped.exists, "an item to stop in the middle of a group", WAIT)
        item, pid = (int(value) for value in stopped.read_text().split())
        previous = item - 1
        # The item before it ran in the same process and its work is not committed:
        # the group is in flight, and the coordinator has heard nothing of it.
        assert group_app.last_run_pid(workdir, previous) == pid
        assert previous not in committed_effects(engine)
        assert status(previous) is ExecutionStatus.WORKING

        os.kill(pid, signal.SIGKILL)

        wait_until(
            lambda: all(status(i) is ExecutionStatus.FINISHED for i in range(1, ITEMS + 1)),
            "every item to finish",
            WAIT,
        )
    finally:
        coordinator.stop(timeout=0)
    effects = committed_effects(engine)
    assert sorted(effects) == list(range(1, ITEMS + 1))
    doubled = {i: runs for i, runs in effects.items() if len(runs) != 1}
    assert not doubled, f"items whose effect committed more than once: {doubled}"
    # The killed group's items ran twice (the first run rolled back with the process),
    # and their effect is the second run's, by another process.
    for item_id in (previous, item):
        ((run, effect_pid),) = effects[item_id]
        assert run == 2 and effect_pid != pid
    # Nobody was charged with the crash: which item of the group caused it is not known.
    with Session(engine) as session:
        charged = {
            i: state["crashes"]
            for i in range(1, ITEMS + 1)
            if (state := worker.state(session, i)) is not None and state["crashes"]
        }
    assert not charged
