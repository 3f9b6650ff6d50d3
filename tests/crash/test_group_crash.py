"""A handler process SIGKILLed in the middle of a group (several items in one
transaction, ``invocation/group.py``): none of the group committed, so every item of
it runs again and each item's effect commits exactly once; nothing of the group was
reported before its commit, so the coordinator still holds every item of it (their
leases are far too long to run out within the test), and the items are run again
alone without charging any of them with the crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dbworker import ExecutionStatus
from dbworker.dialects import for_url
from dbworker.executors import prefetch

from . import group_app
from .support import charged_crashes, kill_mid_group, status_of

WAIT = 60.0
ITEMS = group_app.ITEMS


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
    coordinator = group_app.prepare_run(
        engine, database_url, workdir, group_app.register, group_app.Base, group_app.GroupItem
    )
    worker = coordinator.workers[group_app.WORKER]

    def in_flight(previous: int, pid: int) -> None:
        # The item before it ran in the same process and its work is not committed:
        # the group is in flight, and the coordinator has heard nothing of it.
        assert group_app.last_run_pid(workdir, previous) == pid
        assert previous not in committed_effects(engine)
        assert status_of(worker, engine, previous) is ExecutionStatus.WORKING

    stopped = workdir / group_app.STOPPED
    item, pid = kill_mid_group(coordinator, worker, engine, stopped, ITEMS, in_flight, WAIT)
    previous = item - 1
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
    assert not charged_crashes(worker, engine, range(1, ITEMS + 1))
