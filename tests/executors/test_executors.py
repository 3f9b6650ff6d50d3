"""One behaviour suite for every executor (pool, spawn, subprocess, inline, threads) on every
database: the same handler, the same expectations, and, where an executor cannot do
something by design, a skip that says why.

Every test waits for outcomes with generous deadlines and asserts on what happened
(statuses, recorded errors, pids of the runs, committed rows), never on how long
it took.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from dbworker import ConfigurationError, Event, EventKind, ExecutionStatus, RetryPolicy
from dbworker.dialects import Owner
from dbworker.executors import spawn as spawn_executor
from waiting import DEADLINE, pid_alive, wait_until

from . import app, unimportable
from .support import (
    EXECUTORS,
    INLINE_CANNOT_KILL,
    INLINE_NO_IMPORT,
    INLINE_SHARES_PROCESS,
    Rig,
    child_env,
    executor_params,
    make_choice,
)

FINISHED = ExecutionStatus.FINISHED
FAILED = ExecutionStatus.FAILED
UNFINISHED = ExecutionStatus.UNFINISHED
WORKING = ExecutionStatus.WORKING

#: Quick retries: the tests wait for them, and jitter 0 keeps the delay exact.
QUICK_RETRY = RetryPolicy(max_retries=2, base_delay=0.1, max_delay=0.1, jitter=0)
#: Work is claimed only for a process that is ready to start the handler, so a
#: timeout measures the handler, however long a new process takes to start.
HANDLER_TIMEOUT = 2.0


# -- normal processing -----------------------------------------------------------------


@pytest.mark.parametrize("executor", executor_params())
def test_finished_and_unfinished_items_complete_with_their_writes(rig: Rig, executor: str) -> None:
    coordinator = rig.coordinator(make_choice(executor), concurrency=2)
    plans = ["finish", "unfinished;finish", "unfinished;unfinished;finish", "finish"]
    ids = rig.add(*plans)
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)

    expected_runs = {ids[0]: 1, ids[1]: 2, ids[2]: 3, ids[3]: 1}
    for item_id, count in expected_runs.items():
        assert len(rig.runs(item_id)) == count, item_id
        state = rig.state(coordinator, item_id)
        assert state is not None
        assert (state["attempts"], state["failures"], state["crashes"]) == (count, 0, 0)
        assert state["error"] is None
    # Unfinished() commits the invocation's writes just as Finished() does.
    committed = Counter(effect.item_id for effect in rig.effects())
    assert committed == Counter(expected_runs)
    in_coordinator = {effect.pid == os.getpid() for effect in rig.effects()}
    assert in_coordinator == {executor == "inline"}


# -- the crash table -------------------------------------------------------------------


@dataclass(frozen=True)
class Crash:
    """What a handler does, and what dbworker must have recorded afterwards."""

    id: str
    plan: str
    status: ExecutionStatus
    error: str | None
    error_type: str | None
    runs: int
    crashes: int = 0
    failures: int = 0
    effects: int = 0
    handler: Callable[..., Any] = app.handle
    timeout: float | None = None
    retry: RetryPolicy | None = None
    max_crashes: int = 2
    #: Why the inline executor cannot run this case, if it cannot.
    inline: str | None = None


CRASHES = [
    Crash(
        "raises",
        "raise",
        FAILED,
        "RuntimeError: item 1 raised on purpose",
        "RuntimeError",
        runs=1,
    ),
    Crash(
        "raises-then-retried",
        "raise;finish",
        FINISHED,
        None,
        None,
        runs=2,
        failures=1,
        effects=1,
        retry=QUICK_RETRY,
    ),
    Crash(
        "os-exit-3",
        "exit3",
        FAILED,
        "the handler process exited with status 3",
        "dbworker.WorkerCrashed",
        runs=2,
        crashes=2,
        inline=INLINE_SHARES_PROCESS,
    ),
    Crash(
        "sigkill-self",
        "sigkill",
        FAILED,
        "the handler process was killed by SIGKILL",
        "dbworker.WorkerCrashed",
        runs=2,
        crashes=2,
        inline=INLINE_SHARES_PROCESS,
    ),
    Crash(
        "os-exit-3-once",
        "exit3;finish",
        FINISHED,
        None,
        None,
        runs=2,
        crashes=1,
        effects=1,
        inline=INLINE_SHARES_PROCESS,
    ),
    Crash(
        "hangs-past-timeout",
        "hang",
        FAILED,
        "HandlerTimeout: handler of worker 'job' ran longer than its timeout",
        "dbworker.HandlerTimeout",
        runs=1,
        timeout=HANDLER_TIMEOUT,
        inline=INLINE_CANNOT_KILL,
    ),
    Crash(
        "hangs-past-timeout-then-retried",
        "hang;finish",
        FINISHED,
        None,
        None,
        runs=2,
        failures=1,
        effects=1,
        timeout=HANDLER_TIMEOUT,
        retry=QUICK_RETRY,
        inline=INLINE_CANNOT_KILL,
    ),
    Crash(
        "returns-wrong-type",
        "wrong",
        FAILED,
        "HandlerContractError: handler of worker 'job' returned 42",
        "dbworker.core.errors.HandlerContractError",
        runs=1,
    ),
    Crash(
        "cannot-import-in-child",
        "finish",
        FAILED,
        "cannot import the handler in the worker process: ImportError: this module refuses",
        "ImportError",
        runs=0,
        handler=unimportable.handle,
        inline=INLINE_NO_IMPORT,
    ),
]


def crash_params() -> list[Any]:
    return [
        pytest.param(
            executor,
            case,
            id=f"{executor}-{case.id}",
            marks=(
                pytest.mark.skip(reason=case.inline) if executor == "inline" and case.inline else ()
            ),
        )
        for executor in EXECUTORS
        for case in CRASHES
    ]


@pytest.mark.parametrize(("executor", "case"), crash_params())
def test_crash_table(rig: Rig, executor: str, case: Crash) -> None:
    coordinator = rig.coordinator(
        make_choice(executor),
        handler=case.handler,
        timeout=case.timeout,
        retry=case.retry,
        max_crashes=case.max_crashes,
    )
    [item_id] = rig.add(case.plan)
    coordinator.start()
    rig.wait_status(coordinator, [item_id], case.status)

    state = rig.state(coordinator, item_id)
    assert state is not None
    if case.error is None:
        assert state["error"] is None
    else:
        assert case.error in (state["error"] or ""), state["error"]
    assert state["error_type"] == case.error_type
    assert state["lease_expires_at"] is None
    assert state["crashes"] == case.crashes
    assert state["failures"] == case.failures
    # Every retried failure and every crash led to one more attempt, except a crash
    # that ended the item FAILED.
    final_crash = 1 if case.crashes and case.status is FAILED else 0
    assert state["attempts"] == 1 + state["failures"] + case.crashes - final_crash
    pids = rig.runs(item_id)
    assert len(pids) == case.runs

    if executor == "inline":
        assert set(pids) <= {os.getpid()}
    else:
        assert os.getpid() not in pids
    # On an event loop a timeout cancels the task and the process lives on
    # (test_concurrent.py checks that it does).
    if case.crashes or (case.timeout and executor != "asyncio"):
        # A process that died or was killed cannot host a later run, and stays dead.
        assert len(set(pids)) == len(pids)
        killed = pids if case.status is FAILED else pids[:-1]
        assert not any(pid_alive(pid) for pid in killed)
    # Only a run that returned a valid outcome committed its writes.
    assert len(rig.effects()) == case.effects

    if case.handler is app.handle:
        # The coordinator carries on: a later item runs normally after the crash.
        [after] = rig.add("finish")
        rig.wait_status(coordinator, [after], FINISHED)


# -- process lifecycle -------------------------------------------------------------------


@pytest.mark.parametrize("executor", executor_params(inline=INLINE_SHARES_PROCESS))
def test_a_dying_child_affects_only_its_own_item(rig: Rig, executor: str) -> None:
    # Threads share a process (test_concurrent.py kills one with many in flight): here
    # each of two processes has one.
    options = {"processes": 2} if executor == "threads" else {}
    coordinator = rig.coordinator(make_choice(executor, **options), concurrency=2)
    victim, other = rig.add("gate+exit3;finish", "gate")
    coordinator.start()
    victim_pid, other_pid = (rig.wait_run(i, 1) for i in (victim, other))
    assert victim_pid != other_pid, "two gated items need two processes"

    rig.open_gate(victim, 1)
    # Released at once (the lease is far from expiring) and run again by a new process.
    rig.wait_status(coordinator, [victim], FINISHED)
    rerun = rig.runs(victim)[1]
    assert rerun not in (victim_pid, other_pid)
    assert not pid_alive(victim_pid)

    # The other never noticed: still running in its process, still held.
    assert pid_alive(other_pid)
    assert rig.status(coordinator, other) is WORKING
    rig.open_gate(other, 1)
    rig.wait_status(coordinator, [other], FINISHED)
    assert rig.runs(other) == [other_pid]
    state = rig.state(coordinator, other)
    assert state is not None and state["crashes"] == 0
    victim_state = rig.state(coordinator, victim)
    assert victim_state is not None and victim_state["crashes"] == 1


@pytest.mark.parametrize("executor", ["pool", "subprocess"])
def test_persistent_children_are_reused_and_replaced_when_they_die(rig: Rig, executor: str) -> None:
    coordinator = rig.coordinator(make_choice(executor))
    ids = rig.add("sigkill;finish", "finish", "finish", "finish")
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)

    first, replacement = rig.runs(ids[0])
    assert first != replacement
    assert os.getpid() not in (first, replacement)
    # The replacement is as persistent as the child it replaced.
    for item_id in ids[1:]:
        assert rig.runs(item_id) == [replacement]


def test_spawn_runs_every_invocation_in_a_fresh_process(rig: Rig) -> None:
    coordinator = rig.coordinator(make_choice("spawn"), concurrency=2)
    ids = rig.add("sigkill;finish", "finish", "unfinished;finish", "finish", "finish")
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)

    pids = [pid for item_id in ids for pid in rig.runs(item_id)]
    assert len(pids) == 7
    assert len(set(pids)) == len(pids)
    assert os.getpid() not in pids


def test_spawn_forks_every_invocation_from_one_template_and_leaves_nothing_behind(
    rig: Rig,
) -> None:
    coordinator = rig.coordinator(make_choice("spawn"), concurrency=2)
    ids = rig.add("finish", "unfinished;finish", "finish", "finish")
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)
    found = rig.effects()
    handlers = {e.pid for e in found}
    assert len(handlers) == len(found) == 5
    # One prepared process forked them all: not the coordinator, not a handler.
    [template] = {e.info["ppid"] for e in found}
    assert template != os.getpid() and template not in handlers

    coordinator.stop()
    wait_until(lambda: not pid_alive(template), "the template process to exit")
    assert not [pid for pid in handlers if pid_alive(pid)]


def test_spawn_carries_on_when_its_template_process_dies(rig: Rig) -> None:
    coordinator = rig.coordinator(make_choice("spawn"))
    first = rig.add("finish")
    coordinator.start()
    rig.wait_status(coordinator, first, FINISHED)
    [effect] = rig.effects()
    template = effect.info["ppid"]

    os.kill(template, signal.SIGKILL)
    wait_until(lambda: not pid_alive(template), "the template process to die")
    rest = rig.add("finish", "sigkill;finish", "finish", "finish")
    rig.wait_status(coordinator, rest, FINISHED)

    # Handler processes outlive the template that forked them (a running handler is
    # not disturbed), and a new template forks the ones started after its death.
    later = [e for e in rig.effects() if e.item_id in rest]
    assert {e.info["ppid"] for e in later} - {template, 1}
    assert Counter(e.item_id for e in later) == dict.fromkeys(rest, 1)
    crashed = rig.state(coordinator, rest[1])
    assert crashed is not None and crashed["crashes"] == 1


def test_spawn_without_pidfds_still_runs_every_invocation_in_a_fresh_process(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where the kernel has no pidfds, the coordinator cannot watch processes that are
    # not its children, and multiprocessing starts each process instead.
    monkeypatch.setattr(spawn_executor, "pidfds_supported", lambda: False)
    coordinator = rig.coordinator(make_choice("spawn"), concurrency=2)
    ids = rig.add("sigkill;finish", "finish", "unfinished;finish", "finish")
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)
    pids = [pid for item_id in ids for pid in rig.runs(item_id)]
    assert len(pids) == 6 == len(set(pids))
    assert os.getpid() not in pids


@pytest.mark.backends("postgresql")
def test_spawn_lends_connections_across_processes_but_no_session_state(rig: Rig) -> None:
    # On PostgreSQL a handler process takes over a connection the template opened
    # (saving a server backend per item) and resets its session on the way out.
    coordinator = rig.coordinator(make_choice("spawn"))
    ids = rig.add(*["session"] * 8)
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)
    found = rig.effects()
    assert len({e.pid for e in found}) == len(found) == 8
    backends = Counter(e.info["session"]["backend"] for e in found)
    assert max(backends.values()) > 1, "no connection was lent twice: nothing was tested"
    for effect in found:
        # What the previous holder of the session left (a setting, a temporary table,
        # a session-level advisory lock) was gone. A reset custom setting reads as ''
        # where it was once set in the session, None where never.
        session = effect.info["session"]
        assert session["setting"] in (None, ""), session
        assert (session["temp_table"], session["advisory_lock"]) == (False, 0), session


@pytest.mark.parametrize("executor", executor_params(inline=INLINE_SHARES_PROCESS))
@pytest.mark.parametrize("death", ["sigkill", "exit3"])
def test_a_handler_that_dies_holding_a_lock_does_not_block_the_next_run(
    rig: Rig, executor: str, death: str
) -> None:
    # The first run locks its item's row and dies inside that transaction; the next
    # run needs the same lock. Under spawn on PostgreSQL the dead process's connection
    # belonged to the template, which must close it so the server rolls back.
    coordinator = rig.coordinator(make_choice(executor))
    [item_id] = rig.add(f"lock+{death};lock+finish")
    coordinator.start()
    rig.wait_status(coordinator, [item_id], FINISHED)
    assert len(rig.runs(item_id)) == 2
    [effect] = rig.effects()
    assert effect.run == 2


def test_inline_runs_handlers_in_the_coordinator_process(rig: Rig) -> None:
    coordinator = rig.coordinator(make_choice("inline"), concurrency=2)
    ids = rig.add("finish", "unfinished;finish", "finish")
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)
    assert {pid for item_id in ids for pid in rig.runs(item_id)} == {os.getpid()}


@pytest.mark.parametrize("executor", ["pool", "subprocess"])
def test_max_tasks_per_child_recycles_children(rig: Rig, executor: str) -> None:
    coordinator = rig.coordinator(make_choice(executor, max_tasks_per_child=2))
    ids = rig.add("finish", "finish", "finish")
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)

    # One slot, so items run one after another in id order.
    pids = [rig.runs(item_id) for item_id in ids]
    assert all(len(runs) == 1 for runs in pids), pids
    a, a2, b = (runs[0] for runs in pids)
    assert a == a2, "a child serves max_tasks_per_child invocations"
    assert b != a, "then it is replaced by a new one"
    wait_until(lambda: not pid_alive(a), "the recycled child to exit")


@pytest.mark.parametrize("executor", ["pool", "spawn", "subprocess"])
def test_a_worker_can_choose_an_executor_other_than_the_default(rig: Rig, executor: str) -> None:
    # The coordinator-wide default is inline; only the job worker picks another.
    coordinator = rig.coordinator("inline", dependent=True, worker_executor=make_choice(executor))
    ids = rig.add("finish", "finish")
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED, worker=app.DEPENDENT)

    job_pids = {pid for i in ids for pid in rig.runs(i, app.WORKER)}
    dependent_pids = {pid for i in ids for pid in rig.runs(i, app.DEPENDENT)}
    assert os.getpid() not in job_pids
    assert dependent_pids == {os.getpid()}


# -- the subprocess executor's own interpreter, environment and directory -------------


def test_subprocess_children_get_the_given_interpreter_env_and_cwd(
    rig: Rig, tmp_path: Path
) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    choice = make_choice(
        "subprocess",
        python=sys.executable,
        env=child_env(**{app.MARK_ENV: "from-the-test"}),
        cwd=str(cwd),
    )
    coordinator = rig.coordinator(choice)
    ids = rig.add("finish", "finish")
    coordinator.start()
    rig.wait_status(coordinator, ids, FINISHED)

    facts = [effect.info for effect in rig.effects()]
    assert len(facts) == 2
    for seen in facts:
        assert seen["mark"] == "from-the-test"
        assert Path(str(seen["cwd"])).resolve() == cwd.resolve()
        assert seen["executable"] == sys.executable
        assert seen["pid"] != os.getpid()
    # The test's own process has neither: they came from the executor's settings.
    assert app.MARK_ENV not in os.environ
    assert Path.cwd().resolve() != cwd.resolve()


def test_subprocess_children_can_run_in_another_virtualenv(rig: Rig, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # --without-pip: the venv only needs an interpreter; PYTHONPATH brings the rest.
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
        capture_output=True,
        timeout=DEADLINE,
    )
    python = venv / "bin" / "python"
    assert python.exists()
    coordinator = rig.coordinator(make_choice("subprocess", python=str(python)))
    [item_id] = rig.add("finish")
    coordinator.start()
    rig.wait_status(coordinator, [item_id], FINISHED)

    [effect] = rig.effects()
    assert Path(str(effect.info["prefix"])).resolve() == venv.resolve()
    assert Path(str(effect.info["prefix"])).resolve() != Path(sys.prefix).resolve()
    assert effect.info["executable"] == str(python)


def test_a_timeout_measures_the_handler_not_the_start_of_its_process(
    rig: Rig, tmp_path: Path
) -> None:
    # An interpreter that takes longer to start than the worker's timeout: were work
    # claimed before the child is ready, every attempt would time out before the
    # handler ran (and kill the child that was starting, so the next one too).
    slow_python = tmp_path / "slow-python"
    delay = 2 * HANDLER_TIMEOUT
    slow_python.write_text(f'#!/bin/sh\nsleep {delay}\nexec "{sys.executable}" "$@"\n')
    slow_python.chmod(0o755)
    coordinator = rig.coordinator(
        make_choice("subprocess", python=str(slow_python)), timeout=HANDLER_TIMEOUT
    )
    [item_id] = rig.add("finish")
    coordinator.start()
    rig.wait_status(coordinator, [item_id], FINISHED)

    state = rig.state(coordinator, item_id)
    assert state is not None
    assert (state["attempts"], state["failures"], state["error"]) == (1, 0, None)
    assert len(rig.runs(item_id)) == 1


def test_a_child_that_cannot_start_claims_nothing_and_is_retried(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    # An interpreter that exits at once: no process ever becomes ready, so nothing is
    # claimed (an item is not failed for a broken deployment), and the coordinator
    # keeps trying to start one, saying why it cannot.
    # A short lease wakes the scheduler's loop often (every renewal period), and the
    # loop is where a dead child's replacement is started.
    coordinator = rig.coordinator(make_choice("subprocess", python="/bin/false"), lease_seconds=3)
    [item_id] = rig.add("finish")
    with caplog.at_level(logging.ERROR, logger="dbworker"):
        coordinator.start()
        wait_until(
            lambda: (
                sum("exited before it was ready" in r.getMessage() for r in caplog.records) >= 2
            ),
            "two failed starts to be reported",
        )
    assert "exited with status 1" in caplog.records[-1].getMessage()
    assert coordinator.running
    assert rig.status(coordinator, item_id) is None
    assert rig.runs(item_id) == []


# -- stopping --------------------------------------------------------------------------


@pytest.mark.parametrize("executor", executor_params(inline=INLINE_CANNOT_KILL))
def test_stop_with_timeout_kills_a_hanging_handler_and_releases_its_item(
    rig: Rig, executor: str
) -> None:
    coordinator = rig.coordinator(make_choice(executor))
    [item_id] = rig.add("hang;finish")
    coordinator.start()
    pid = rig.wait_run(item_id, 1)

    coordinator.stop(timeout=0.5)

    assert not coordinator.running
    assert not pid_alive(pid)
    state = rig.state(coordinator, item_id)
    assert state is not None
    assert state["execution_status"] is UNFINISHED
    assert state["crashes"] == 0, "a deliberate stop is not a crash"
    assert state["lease_expires_at"] is None
    assert state["error"] == "stopped by coordinator shutdown"
    assert rig.effects() == []

    # Claimable at once by another coordinator: the lease (LONG_LEASE) never runs out
    # within this wait, so only the release can let the item run again.
    successor = rig.coordinator(make_choice(executor))
    successor.start()
    rig.wait_status(successor, [item_id], FINISHED)
    assert len(rig.runs(item_id)) == 2
    done = rig.state(successor, item_id)
    assert done is not None and (done["crashes"], done["attempts"]) == (0, 2)


@pytest.mark.parametrize("executor", executor_params())
def test_stop_without_timeout_waits_for_running_handlers(rig: Rig, executor: str) -> None:
    coordinator = rig.coordinator(make_choice(executor))
    running, waiting = rig.add("gate", "finish")
    coordinator.start()
    rig.wait_run(running, 1)

    stopper = threading.Thread(target=coordinator.stop, name="stopper")
    stopper.start()
    # The handler is blocked on its gate, so stop() cannot have returned whatever the
    # delay; the delay only gives a wrongly returning stop() the time to show itself.
    time.sleep(0.5)
    assert stopper.is_alive(), "stop() returned while a handler was still running"

    rig.open_gate(running, 1)
    stopper.join(DEADLINE)
    assert not stopper.is_alive()
    assert not coordinator.running
    assert rig.status(coordinator, running) is FINISHED
    assert [e.item_id for e in rig.effects()] == [running]
    # Stopping claims nothing new: the waiting item was never claimed.
    assert rig.status(coordinator, waiting) is None
    assert rig.runs(waiting) == []


# -- a lost claim ----------------------------------------------------------------------


def take_over(rig: Rig, coordinator: Any, item_id: int) -> None:
    """Another holder takes the item over: the lease is made to have expired, and the
    item claimed through the dialect (in one transaction, so nobody else gets it)."""
    worker = coordinator._registration(app.WORKER)
    table = worker.table.table
    with rig.engine.begin() as conn:
        conn.execute(update(table).where(table.c.source_id == item_id).values(lease_expires_at=0.0))
        claims = coordinator._dialect.claim(
            conn, worker.table, worker.eligible_query(), 1, 600.0, Owner("thief", 4242)
        )
    assert [claim.source_id for claim in claims] == [item_id]


@pytest.mark.parametrize("executor", executor_params())
def test_a_lost_claim_stops_the_handler(rig: Rig, executor: str) -> None:
    # Renewals every second (a third of the lease) notice the takeover quickly.
    coordinator = rig.coordinator(make_choice(executor), lease_seconds=3)
    [item_id] = rig.add("gate")
    coordinator.start()
    pid = rig.wait_run(item_id, 1)

    take_over(rig, coordinator, item_id)

    if executor == "inline":
        # A thread cannot be killed: it runs on, and its completion is fenced off.
        assert pid == os.getpid()
        rig.open_gate(item_id, 1)
        wait_until(lambda: coordinator.health().completed >= 1, "the inline handler to end")
    else:
        wait_until(lambda: not pid_alive(pid), "the handler's process to be killed")
        rig.open_gate(item_id, 1)

    # The new holder keeps the item; the old handler committed nothing.
    state = rig.state(coordinator, item_id)
    assert state is not None
    assert state["execution_status"] is WORKING
    assert state["owner"] == {"host": "thief", "pid": 4242}
    assert rig.effects() == []
    assert rig.runs(item_id) == [pid]


# -- drain -----------------------------------------------------------------------------


@pytest.mark.parametrize("executor", executor_params())
def test_drain_runs_everything_in_process_including_dependent_work(rig: Rig, executor: str) -> None:
    # The configured executor is irrelevant to drain(): it always runs in-process.
    coordinator = rig.coordinator(make_choice(executor), dependent=True, concurrency=2)
    done, steps, broken, later = rig.add("finish", "unfinished;finish", "raise", "finish")

    report = coordinator.drain()

    assert report.counts() == {
        app.WORKER: Counter({"finished": 3, "unfinished": 1, "failed": 1}),
        app.DEPENDENT: Counter({"finished": 3}),
    }
    assert len(report) == 8
    failed = [item for item in report.items if item.outcome == "failed"]
    assert [(i.worker, i.source_id) for i in failed] == [(app.WORKER, broken)]
    assert "raised on purpose" in (failed[0].error or "")
    for item_id in (done, steps, later):
        assert rig.status(coordinator, item_id) is FINISHED
        assert rig.status(coordinator, item_id, app.DEPENDENT) is FINISHED
    assert rig.status(coordinator, broken) is FAILED
    assert rig.status(coordinator, broken, app.DEPENDENT) is None
    every_pid = {e.pid for e in rig.effects(worker=None)}
    assert every_pid == {os.getpid()}, "drain() starts no process"

    # Nothing is left: a second drain runs nothing.
    assert len(coordinator.drain()) == 0


def test_drain_gives_up_an_item_whose_holders_vanished_too_often(rig: Rig) -> None:
    """drain() takes the scheduler's path for every ending, a vanished holder's too: a
    takeover that reaches max_crashes fails the item instead of running it."""
    coordinator = rig.coordinator("inline", max_crashes=2)
    [item_id] = rig.add("finish")
    table = coordinator.workers[app.WORKER].execution_table
    with rig.engine.begin() as conn:
        # A holder that vanished once already (crashes 1), its lease long expired.
        conn.execute(
            table.insert().values(
                source_id=item_id,
                status="working",
                token=1,
                lease_expires_at=1.0,
                attempts=1,
                failures=0,
                crashes=1,
                discovered_at=1.0,
                updated_at=1.0,
            )
        )
    seen: list[Event] = []
    coordinator.events.subscribe(seen.append)

    report = coordinator.drain()

    [drained] = report.items
    assert (drained.source_id, drained.outcome) == (item_id, "failed")
    assert rig.runs(item_id) == [], "an item given up is not run"
    state = rig.state(coordinator, item_id)
    assert state is not None
    assert state["execution_status"] is FAILED
    assert (state["crashes"], state["error_type"]) == (2, "dbworker.WorkerCrashed")
    assert [(e.kind, e.source_id) for e in seen] == [(EventKind.CRASHED, item_id)]


@pytest.mark.parametrize("executor", executor_params())
def test_drain_refuses_to_run_while_started(rig: Rig, executor: str) -> None:
    coordinator = rig.coordinator(make_choice(executor))
    [item_id] = rig.add("gate")
    coordinator.start()
    rig.wait_run(item_id, 1)
    with pytest.raises(ConfigurationError, match=r"drain\(\)"):
        coordinator.drain()
    rig.open_gate(item_id, 1)
    coordinator.stop()
    # The refused drain ran nothing: the started coordinator ran the item, once.
    assert rig.status(coordinator, item_id) is FINISHED
    assert len(rig.runs(item_id)) == 1
