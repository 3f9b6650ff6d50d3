"""A process running many handlers at once (the threads and asyncio executors) that
dies takes all of them: every one is released at once and runs again, and each
item's writes commit exactly once."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine

from dbworker import ExecutionStatus
from waiting import pid_alive, wait_until

from . import app
from .conftest import CoordinatorFactory
from .support import add_items, effects, open_gate, runs, state, status, wait_for_run

#: Far longer than any wait below: a re-run within a wait can only come from the
#: coordinator releasing the claims when it saw the process die, never from a lease.
LONG_LEASE = 120.0
WAIT = 60.0
IN_FLIGHT = 50


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["threads", "asyncio", "uvloop"])
def test_sigkilled_process_with_fifty_handlers_in_flight_reruns_each_once(
    engine: Engine, workdir: Path, coordinators: CoordinatorFactory, executor: str
) -> None:
    coordinator = coordinators(lease_seconds=LONG_LEASE, concurrency=IN_FLIGHT, executor=executor)
    item_ids = add_items(engine, workdir, [app.GATE] * IN_FLIGHT)
    # Second runs may go ahead as soon as they start; first runs wait at their gates.
    for item_id in item_ids:
        open_gate(workdir, item_id, 2)
    coordinator.start()
    pids = {wait_for_run(workdir, item_id, 1, WAIT) for item_id in item_ids}
    assert len(pids) == 1, "fifty handlers in flight in one process"
    [victim] = pids

    os.kill(victim, signal.SIGKILL)

    wait_until(
        lambda: all(status(coordinator, engine, i) is ExecutionStatus.FINISHED for i in item_ids),
        "every item to finish on its second run",
        WAIT,
    )
    assert not pid_alive(victim)
    reruns = {runs(workdir, item_id)[1] for item_id in item_ids}
    assert len(reruns) == 1 and victim not in reruns, "one new process ran them again"
    for item_id in item_ids:
        assert len(runs(workdir, item_id)) == 2, item_id
        finished = state(coordinator, engine, item_id)
        assert finished is not None
        assert (finished["attempts"], finished["crashes"]) == (2, 1), item_id
    committed = Counter(effect[0] for effect in effects(engine))
    assert committed == Counter(item_ids), "each item's writes committed exactly once"
    assert {effect[1] for effect in effects(engine)} == {2}, "only second runs committed"
