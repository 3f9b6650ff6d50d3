"""A whole coordinator SIGKILLed mid-run: its children stop, and nothing is lost or doubled."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from sqlalchemy import Engine

from dbworker import ExecutionStatus
from waiting import wait_until

from . import app
from .conftest import CoordinatorFactory
from .support import (
    add_items,
    coordinator_process,
    effect_count,
    effects,
    live_session_members,
    open_gate,
    runs,
    state,
    status,
    unfinished_states,
)

# The PostgreSQL runs again through PgBouncer in transaction mode (tests/topologies).
pytestmark = pytest.mark.via("pgbouncer")

ITEMS = 30
#: Long enough that a SIGKILL lands while handlers run, short enough to keep the test quick.
HANDLER_SECONDS = 0.3
#: The killed coordinator's leases: what the survivor has to wait out before taking over.
SHORT_LEASE = 2.0


@pytest.mark.slow
# spawn: handler processes are forked by a template process, not by the fork server,
# and must notice the coordinator's death as pool children do.
@pytest.mark.parametrize("executor", ["pool", "spawn"])
def test_sigkilled_coordinator_loses_nothing_and_doubles_nothing(
    database_url: str,
    engine: Engine,
    workdir: Path,
    coordinators: CoordinatorFactory,
    executor: str,
) -> None:
    # The survivor (not started yet) also creates the tables the first one needs.
    survivor = coordinators(lease_seconds=30, concurrency=3)
    modes = [app.SLEEP] * ITEMS
    # Two items block in the first coordinator, so it certainly dies mid-handler with
    # claims outstanding; their second runs (the survivor's) may go ahead.
    blocked = [8, 9]
    for item_id in blocked:
        modes[item_id - 1] = app.GATE
        open_gate(workdir, item_id, 2)
    item_ids = add_items(engine, workdir, modes, sleep_seconds=HANDLER_SECONDS)

    with coordinator_process(
        database_url,
        workdir / "first.log",
        lease_seconds=SHORT_LEASE,
        concurrency=3,
        executor=executor,
    ) as first:
        wait_until(
            lambda: effect_count(engine) >= 6 and all(runs(workdir, i) for i in blocked),
            "the first coordinator to make progress and start the blocking items",
            diagnose=lambda: (
                effect_count(engine),
                {i: runs(workdir, i) for i in item_ids},
                (workdir / "first.log").read_text()[-3000:],
            ),
        )
        # A real crash takes the coordinator alone: nobody is left to stop its children
        # in an orderly way. They must notice on their own that their parent is gone.
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait() == -signal.SIGKILL
        wait_until(
            lambda: not live_session_members(first.pid),
            "the dead coordinator's fork server and handler processes to exit",
        )

    stranded = [i for i in item_ids if status(survivor, engine, i) is ExecutionStatus.WORKING]
    assert set(blocked) <= set(stranded), stranded
    assert effect_count(engine) < ITEMS, "everything finished before the kill"

    survivor.start()
    wait_until(
        lambda: all(status(survivor, engine, i) is ExecutionStatus.FINISHED for i in item_ids),
        "the second coordinator to finish every item",
        diagnose=lambda: (
            unfinished_states(survivor, engine, item_ids),
            survivor.health(),
            (workdir / "first.log").read_text()[-3000:],
        ),
    )

    per_item = {i: [run for _, run, _ in effects(engine, i)] for i in item_ids}
    assert {i: len(found) for i, found in per_item.items()} == dict.fromkeys(item_ids, 1), (
        "every item's effect must be committed exactly once"
    )
    for item_id in stranded:
        taken_over = state(survivor, engine, item_id)
        assert taken_over is not None
        # The expired lease counts as a crash of its holder, and a new claim followed.
        assert taken_over["crashes"] == 1
        assert taken_over["attempts"] == 2
        assert per_item[item_id] == [2], "the survivor's run committed, and only it"
