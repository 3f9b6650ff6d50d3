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

from dbworker import ExecutionStatus
from dbworker.dialects import for_url
from dbworker.executors import prefetch
from waiting import wait_until

from . import group_app
from . import lone_finish_app as app
from .support import charged_crashes, status_of

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

    def status(item_id: int) -> ExecutionStatus | None:
        return status_of(worker, engine, item_id)

    stopped = workdir / group_app.STOPPED
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
    assert not charged_crashes(worker, engine, range(1, ITEMS + 1))
