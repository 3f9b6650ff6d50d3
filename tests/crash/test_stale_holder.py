"""A holder whose claim was taken over can neither commit nor keep running.

Fencing at completion: the handler's writes and its status change share a transaction
that commits only under the current token. Fencing at renewal: a coordinator that
finds its token superseded kills the handler instead of letting it run beside the new
holder.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.exc import DBAPIError

from dbworker import Coordinator, ExecutionStatus
from dbworker.core.tasks import ResultKind, Task
from dbworker.dialects import Owner, for_url
from dbworker.invocation import ChildConfig, Runtime
from waiting import pid_alive, wait_until

from . import app
from .conftest import CoordinatorFactory
from .support import (
    add_items,
    coordinator_process,
    effects,
    open_gate,
    proc_stat,
    runs,
    state,
    status,
    wait_for_run,
)

# The PostgreSQL runs again through PgBouncer in transaction mode (tests/topologies).
pytestmark = pytest.mark.via("pgbouncer")

#: Long enough that no lease held by the test or a surviving coordinator runs out.
LONG_LEASE = 120.0
#: The lease of a coordinator that is about to lose its claim.
SHORT_LEASE = 2.0


@pytest.mark.parametrize(
    ("mode", "current_holder_result"),
    [
        (app.QUICK, ResultKind.FINISHED),
        (app.UNFINISHED, ResultKind.UNFINISHED),
        (app.RAISE, ResultKind.FAILED),
    ],
)
def test_runtime_of_a_superseded_token_commits_nothing(
    database_url: str,
    engine: Engine,
    dbworker_engine: Engine,
    workdir: Path,
    coordinators: CoordinatorFactory,
    mode: str,
    current_holder_result: ResultKind,
) -> None:
    coordinator = coordinators(lease_seconds=30, concurrency=1)
    worker = coordinator._registration(app.WORKER)
    add_items(engine, workdir, [mode])
    # Two claimers an hour apart on a fake clock: the second takes the item over
    # because the first one's lease has run out, which supersedes the first token.
    start = time.time()
    early, late = (
        for_url(database_url, clock=lambda: start),
        for_url(database_url, clock=lambda: start + 3600),
    )
    with dbworker_engine.begin() as conn:
        early.discover(conn, worker.table)
        [stale] = early.claim(conn, worker.table, worker.eligible_query(), 1, 30, Owner("a", 1))
    with dbworker_engine.begin() as conn:
        [current] = late.claim(conn, worker.table, worker.eligible_query(), 1, 30, Owner("b", 2))
    assert current.token != stale.token

    runtime = Runtime(ChildConfig(database_url, {}))
    try:
        result = runtime.run(
            Task(app.WORKER, 1, stale.token, stale.attempts, stale.failures, app.handle, app.Item)
        )
        # The handler did write (and flush) its effect, then the transaction rolled back.
        assert app.marker_path(workdir, "flushed", 1, 1).exists()
        assert result.kind is ResultKind.LOST, result
        assert effects(engine) == []
        taken = state(coordinator, engine, 1)
        assert taken is not None
        assert taken["execution_status"] is ExecutionStatus.WORKING
        assert taken["owner"] == {"host": "b", "pid": 2}
        assert (taken["attempts"], taken["error"]) == (2, None)

        # Control: the same run under the current token does commit, so the absence
        # above is the fence at work and not a handler that never wrote.
        result = runtime.run(
            Task(
                app.WORKER,
                1,
                current.token,
                current.attempts,
                current.failures,
                app.handle,
                app.Item,
            )
        )
    finally:
        runtime.dispose()
    assert result.kind is current_holder_result, result
    if mode == app.RAISE:
        assert effects(engine) == []
        assert status(coordinator, engine, 1) is ExecutionStatus.FAILED
    else:
        assert effects(engine) == [(1, 2, os.getpid())]


def _row_is_free(engine: Engine, coordinator: Coordinator, item_id: int) -> bool:
    """Whether no transaction holds a lock that would keep another coordinator from
    claiming ``item_id`` (SQLite: the database-wide write lock)."""
    if engine.dialect.name == "sqlite":
        path = engine.url.database
        assert path
        probe = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            probe.close()
    table = coordinator._registration(app.WORKER).table.table
    try:
        with engine.begin() as conn:
            conn.execute(
                select(table.c.source_id)
                .where(table.c.source_id == item_id)
                .with_for_update(nowait=True)
            ).all()
    except DBAPIError:
        return False
    return True


def _freeze(pid: int, engine: Engine, coordinator: Coordinator, item_id: int) -> None:
    """SIGSTOP a coordinator, but not in the middle of a transaction on the item.

    A coordinator frozen with the item's row locked (SQLite: the database locked) would
    block every other coordinator, which is a different scenario from the one under
    test: the frozen one must simply stop renewing.
    """
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: (s := proc_stat(pid)) is not None and s.state == "T", "SIGSTOP")
        if _row_is_free(engine, coordinator, item_id):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("could not stop the coordinator outside a transaction")


@pytest.mark.slow
def test_frozen_coordinator_cannot_commit_after_takeover(
    database_url: str, engine: Engine, workdir: Path, coordinators: CoordinatorFactory
) -> None:
    second = coordinators(lease_seconds=LONG_LEASE, concurrency=1)
    add_items(engine, workdir, [app.GATE])
    log = workdir / "first.log"
    with coordinator_process(database_url, log, lease_seconds=SHORT_LEASE, concurrency=1) as first:
        first_child = wait_for_run(workdir, 1, 1)
        # Frozen, the first coordinator can no longer renew; its child runs on.
        _freeze(first.pid, engine, second, 1)
        second.start()
        # Its lease runs out and the second coordinator takes the item over.
        second_child = wait_for_run(workdir, 1, 2)
        assert second_child != first_child
        taken = state(second, engine, 1)
        assert taken is not None
        assert taken["execution_status"] is ExecutionStatus.WORKING
        assert taken["owner"] is not None and taken["owner"]["pid"] == os.getpid()

        # The stale handler completes while the new holder still works on the item
        # (same status, only the token differs) and while its own coordinator is
        # frozen (so nothing kills it first): it writes, its completion is refused,
        # and its writes roll back.
        open_gate(workdir, 1, 1)
        wait_until(
            app.marker_path(workdir, "rolledback", 1, 1).exists,
            "the stale handler's transaction to roll back",
        )
        assert app.marker_path(workdir, "flushed", 1, 1).exists(), "it did write"
        assert effects(engine) == []
        assert status(second, engine, 1) is ExecutionStatus.WORKING
        assert pid_alive(first_child)
        # Give the child a moment to hand its result to the frozen coordinator, which
        # then reads it rather than finding out at its next renewal (either would do).
        time.sleep(0.5)
        os.kill(first.pid, signal.SIGCONT)
        wait_until(
            lambda: f"[{app.WORKER} 1 #1]: item lost its claim" in log.read_text(),
            "the first coordinator to learn that it lost the claim",
            diagnose=log.read_text,
        )

        open_gate(workdir, 1, 2)
        wait_until(
            lambda: status(second, engine, 1) is ExecutionStatus.FINISHED,
            "the new holder to finish the item",
        )
        assert effects(engine) == [(1, 2, second_child)], "exactly the new holder's writes"
        final = state(second, engine, 1)
        assert final is not None
        assert (final["attempts"], final["crashes"], final["error"]) == (2, 1, None)
        # The first coordinator is still healthy: it stops cleanly when asked.
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0, log.read_text()


@pytest.mark.slow
def test_renewal_that_finds_the_claim_taken_over_kills_the_handler(
    engine: Engine, dbworker_engine: Engine, workdir: Path, coordinators: CoordinatorFactory
) -> None:
    # Renewal every lease / 3 = 1 s, so the loss is noticed within a few seconds.
    coordinator = coordinators(lease_seconds=3, concurrency=1)
    worker = coordinator._registration(app.WORKER)
    add_items(engine, workdir, [app.GATE])
    coordinator.start()
    child = wait_for_run(workdir, 1, 1)

    # Take the item over behind the coordinator's back: expire the lease and claim it
    # in one transaction (a renewal in between would otherwise revive the lease).
    table = worker.table.table
    with dbworker_engine.begin() as conn:
        conn.execute(update(table).where(table.c.source_id == 1).values(lease_expires_at=0.0))
        claims = coordinator._dialect.claim(
            conn, worker.table, worker.eligible_query(), 1, LONG_LEASE, Owner("intruder", 1)
        )
    assert [c.source_id for c in claims] == [1]

    # The gate never opens: only the coordinator can end this handler.
    wait_until(lambda: not pid_alive(child), "the coordinator to kill the stale handler")
    assert not app.marker_path(workdir, "flushed", 1, 1).exists()
    assert effects(engine) == []
    taken = state(coordinator, engine, 1)
    assert taken is not None
    assert taken["execution_status"] is ExecutionStatus.WORKING
    assert taken["owner"] == {"host": "intruder", "pid": 1}
    # The takeover counted one crash (of the holder that let its lease expire); the
    # coordinator left the record alone: it is the intruder's now.
    assert (taken["attempts"], taken["crashes"], taken["error"]) == (2, 1, None)
    assert runs(workdir, 1) == [child]
    coordinator.stop(timeout=30)
    assert not coordinator.running
