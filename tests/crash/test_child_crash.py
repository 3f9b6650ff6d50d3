"""A handler process that dies affects only its own item, which is released at once."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from sqlalchemy import Engine

from dbworker import ExecutionStatus
from waiting import pid_alive, wait_until

from . import app
from .conftest import CoordinatorFactory
from .support import (
    add_items,
    all_pids,
    effects,
    live_children,
    open_gate,
    proc_stat,
    runs,
    state,
    status,
    wait_for_run,
)

# The PostgreSQL runs again through PgBouncer in transaction mode (tests/topologies).
pytestmark = pytest.mark.via("pgbouncer")

#: Far longer than any wait below: a re-run within a wait can only come from the
#: coordinator releasing the claim when it saw the child die, never from the lease.
LONG_LEASE = 120.0
#: Shorter than LONG_LEASE, so the causal argument above holds.
WAIT = 60.0


@pytest.mark.slow
def test_sigkilled_child_affects_only_its_item_and_the_pool_heals(
    engine: Engine, workdir: Path, coordinators: CoordinatorFactory
) -> None:
    concurrency = 3
    coordinator = coordinators(lease_seconds=LONG_LEASE, concurrency=concurrency)
    # Items 1-3 block in the pool's three children; 4-6 wait for a free child.
    modes = [app.GATE] * 3 + [app.QUICK] * 3
    item_ids = list(range(1, len(modes) + 1))
    add_items(engine, workdir, modes)
    # The second run of the victim may go ahead as soon as it starts.
    open_gate(workdir, 1, 2)
    before = all_pids()
    coordinator.start()

    victim, other_a, other_b = (wait_for_run(workdir, i, 1, WAIT) for i in (1, 2, 3))
    assert len({victim, other_a, other_b}) == 3, "three blocked items need three children"
    victim_stat = proc_stat(victim)
    assert victim_stat is not None
    fork_server = victim_stat.ppid

    os.kill(victim, signal.SIGKILL)

    # Released at once and run again (by a new child) long before the lease could expire.
    rerun = wait_for_run(workdir, 1, 2, WAIT)
    wait_until(
        lambda: status(coordinator, engine, 1) is ExecutionStatus.FINISHED,
        "the killed item to finish on its second run",
        WAIT,
    )
    wait_until(
        lambda: all(status(coordinator, engine, i) is ExecutionStatus.FINISHED for i in (4, 5, 6)),
        "the waiting items to finish",
        WAIT,
    )
    assert not pid_alive(victim)
    assert rerun not in (victim, other_a, other_b), "the replacement is a new process"
    for item_id in (4, 5, 6):
        assert runs(workdir, item_id) == [rerun], "a new child ran the later items"

    victim_state = state(coordinator, engine, 1)
    assert victim_state is not None
    assert victim_state["attempts"] == 2
    assert victim_state["crashes"] == 1
    assert effects(engine, 1) == [(1, 2, rerun)], "only the second run committed"

    # The other in-flight items were untouched: still running in their own children.
    for item_id, pid in ((2, other_a), (3, other_b)):
        assert status(coordinator, engine, item_id) is ExecutionStatus.WORKING
        assert pid_alive(pid)
    # The pool is back to its size: the OS sees exactly `concurrency` live children,
    # the two survivors and the replacement, and no more.
    wait_until(
        lambda: live_children(fork_server) - before == {other_a, other_b, rerun},
        f"exactly {concurrency} live pool children",
        WAIT,
    )

    open_gate(workdir, 2, 1)
    open_gate(workdir, 3, 1)
    wait_until(
        lambda: all(status(coordinator, engine, i) is ExecutionStatus.FINISHED for i in item_ids),
        "every item to finish",
        WAIT,
    )
    for item_id, pid in ((2, other_a), (3, other_b)):
        finished = state(coordinator, engine, item_id)
        assert finished is not None
        assert (finished["attempts"], finished["crashes"]) == (1, 0)
        assert effects(engine, item_id) == [(item_id, 1, pid)]
    assert sorted(e[0] for e in effects(engine)) == item_ids, "each item committed exactly once"


@pytest.mark.slow
def test_handler_that_always_kills_its_process_ends_failed(
    engine: Engine, workdir: Path, coordinators: CoordinatorFactory
) -> None:
    # Both crash loops run side by side, one per child. Item 3 comes last in the
    # default (primary key) order, so it is claimed ahead of neither of them while
    # they are still claimable.
    coordinator = coordinators(lease_seconds=LONG_LEASE, concurrency=2)
    add_items(engine, workdir, [app.SIGKILL_SELF, app.EXIT_3, app.QUICK])
    coordinator.start()

    wait_until(
        lambda: (
            status(coordinator, engine, 3) is ExecutionStatus.FINISHED
            and status(coordinator, engine, 1) is ExecutionStatus.FAILED
            and status(coordinator, engine, 2) is ExecutionStatus.FAILED
        ),
        "both crashing items to fail and the last item to finish",
        WAIT,
    )
    for item_id, exit_description in ((1, r"\bSIGKILL\b"), (2, r"\bstatus 3\b")):
        failed = state(coordinator, engine, item_id)
        assert failed is not None
        assert failed["execution_status"] is ExecutionStatus.FAILED
        assert failed["crashes"] == 3, "the default max_crashes"
        assert failed["attempts"] == 3
        assert failed["error_type"] == "dbworker.WorkerCrashed"
        assert re.search(exit_description, failed["error"] or ""), failed["error"]
        pids = runs(workdir, item_id)
        # Exactly max_crashes runs (none after FAILED), each in its own process.
        assert len(pids) == 3, pids
        assert len(set(pids)) == 3, pids
        assert effects(engine, item_id) == []
    assert effects(engine) == [(3, 1, runs(workdir, 3)[0])]
