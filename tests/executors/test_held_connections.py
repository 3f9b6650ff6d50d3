"""A handler process keeps its connection from one invocation to the next, and what
the pool did at each checkout (a ping after idling) still happens."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from dbworker import Finished
from dbworker.core.tasks import ResultKind, Task
from dbworker.dialects import Owner, for_url, liveness
from dbworker.invocation import ChildConfig, Runtime
from server_sessions import drop_on_server

from . import app
from .support import Rig

#: What the handlers below saw of their connection, in order (they run in this process).
SEEN: list[Any] = []


def _identity(session: Session) -> Any:
    conn = session.connection()
    name = conn.dialect.name
    if name == "postgresql":
        return conn.execute(text("SELECT pg_backend_pid()")).scalar()
    if name == "mysql":
        return conn.execute(text("SELECT CONNECTION_ID()")).scalar()
    return id(conn.connection.dbapi_connection)


def note_connection(source: app.Item, session: Session) -> Finished:
    SEEN.append(_identity(session))
    return Finished()


def note_connection_then_raise(source: app.Item, session: Session) -> Finished:
    SEEN.append(_identity(session))
    session.execute(text("SELECT 1"))
    raise RuntimeError("after a statement, with the transaction open")


def _tasks(rig: Rig, handler: Any, count: int) -> list[Task]:
    SEEN.clear()
    coordinator = rig.coordinator("pool", handler=handler)
    registration = coordinator._registration(app.WORKER)
    rig.add(*["finish"] * count)
    dialect = for_url(rig.url)
    with rig.engine.begin() as conn:
        dialect.discover(conn, registration.table)
    with rig.engine.begin() as conn:
        claims = dialect.claim(
            conn, registration.table, registration.eligible_query(), count, 300.0, Owner("t", 1)
        )
    return [registration.task(claim) for claim in claims]


def _runtime(rig: Rig) -> Runtime:
    return Runtime(ChildConfig(rig.url, {}, type(for_url(rig.url))))


def test_invocations_in_a_row_share_one_connection(rig: Rig) -> None:
    tasks = _tasks(rig, note_connection, 3)
    runtime = _runtime(rig)
    try:
        assert [runtime.run(task).kind for task in tasks] == [ResultKind.FINISHED] * 3
    finally:
        runtime.dispose()
    assert len(SEEN) == 3 and len(set(SEEN)) == 1


def _kept(runtime: Runtime) -> Any:
    """The connections this thread keeps for its next invocation (None: none)."""
    return getattr(runtime.held._local, "held", None)


def test_a_failed_invocation_gives_its_connection_back(rig: Rig) -> None:
    finishing = _tasks(rig, note_connection, 1)
    runtime = _runtime(rig)
    try:
        assert runtime.run(finishing[0]).kind is ResultKind.FINISHED
        assert _kept(runtime) is not None, "a finished invocation keeps its connection"
        failing = _tasks(rig, note_connection_then_raise, 1)
        assert runtime.run(failing[0]).kind is ResultKind.FAILED
        # Whatever the failure left (here an open transaction) goes back to the pool,
        # which rolls it back; the next invocation checks out a clean one.
        assert _kept(runtime) is None
    finally:
        runtime.dispose()


@pytest.mark.backends("postgresql", "mysql")
@pytest.mark.parametrize(
    ("idle_seconds", "second"),
    [
        # Every pause counts as idling: the next invocation pings first, and runs.
        (0.0, ResultKind.FINISHED),
        # The check can fail: with the ping skipped, the same drop fails the item (a
        # database error: retried).
        (float("inf"), ResultKind.RETRYING),
    ],
)
def test_a_kept_connection_the_server_dropped_while_idle_is_replaced(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, idle_seconds: float, second: ResultKind
) -> None:
    tasks = _tasks(rig, note_connection, 2)
    runtime = _runtime(rig)
    try:
        assert runtime.run(tasks[0]).kind is ResultKind.FINISHED
        drop_on_server(rig.url, SEEN[0])
        monkeypatch.setattr(liveness, "IDLE_SECONDS", idle_seconds)
        assert runtime.run(tasks[1]).kind is second
    finally:
        runtime.dispose()
    if second is ResultKind.FINISHED:
        assert SEEN[1] != SEEN[0]
