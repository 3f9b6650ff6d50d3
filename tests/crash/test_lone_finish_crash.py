"""A handler process SIGKILLed in the middle of a group of lone finishes (SQLite: items
that wrote nothing, whose FINISHes are recorded together after the group,
``invocation/lone_finishes.py``): none of the group's FINISHes was recorded, so the
coordinator still holds every item of it (their leases are far too long to run out
within the test), runs each again alone, and charges none of them with the crash; every
item ends FINISHED."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from dbworker import ExecutionStatus
from dbworker.dialects import for_url
from dbworker.executors import prefetch

from . import group_app
from . import lone_finish_app as app
from .support import charged_crashes, kill_mid_group, status_of

WAIT = 60.0
ITEMS = group_app.ITEMS


@pytest.mark.slow
def test_a_child_killed_mid_group_runs_each_item_of_it_again_uncharged(
    engine: Engine, database_url: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialect = for_url(database_url)
    if dialect.supports_group_commit or not dialect.groups_lone_finishes:
        pytest.skip("this database groups in one transaction, or not at all (test_group_crash)")
    monkeypatch.setattr(prefetch, "GROUP_TYPICAL_SECONDS", 0.1)  # as test_group_crash
    coordinator = group_app.prepare_run(
        engine, database_url, workdir, app.register, app.Base, app.LoneItem
    )
    worker = coordinator.workers[app.WORKER]

    def in_flight(previous: int, pid: int) -> None:
        # The item before it ran in the same process and finished, but its FINISH is
        # not recorded: the group is in flight, and the coordinator has heard nothing.
        assert app.runs(workdir, previous)[-1] == pid
        assert status_of(worker, engine, previous) is ExecutionStatus.WORKING

    stopped = workdir / group_app.STOPPED
    item, pid = kill_mid_group(coordinator, worker, engine, stopped, ITEMS, in_flight, WAIT)
    previous = item - 1
    # The killed group's items ran again, in another process.
    for item_id in (previous, item):
        pids = app.runs(workdir, item_id)
        assert len(pids) == 2 and pids[0] == pid and pids[1] != pid
    assert not charged_crashes(worker, engine, range(1, ITEMS + 1))
