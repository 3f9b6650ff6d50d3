"""A service that starts a Threads, AsyncIO or Pool coordinator from a single-threaded
process (``python -m tests.executors.forked_app URL MODE``), as most services do: its
handler processes are then forked from the coordinator (``executors/interpreter.py``;
the pool's, ``POOL_CONCURRENCY`` of them, as it starts). Prints one
JSON line: the coordinator's pid, each call's handler pids, and the processes under the
coordinator with their parents and whether each catches SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Integer, create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, ExecutionStatus, Finished

CALLS = 20
POOL_CONCURRENCY = 2


class Base(DeclarativeBase):
    pass


class ForkedCall(Base):
    __tablename__ = "forked_calls"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)


class ForkedEffect(Base):
    """One row per committed call; no unique constraint, so duplicates would show."""

    __tablename__ = "forked_effects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    call_id: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    #: The server session of the application's engine the handler used (None on SQLite).
    app_session: Mapped[int | None] = mapped_column(Integer, nullable=True)


#: The application's own engine, beside the coordinator's: the service uses it before it
#: starts the coordinator, so its pool holds connections when the handler processes
#: fork, and the pool's handler uses it too (a module-level engine, as many apps have).
APP_ENGINE: Engine | None = None
#: Connections the service holds open at once before it starts: its pool then has that
#: many, all of which the service has seen.
APP_CONNECTIONS = 3


def server_session(conn: Connection) -> int | None:
    """Which server session ``conn`` is (None on SQLite: no server)."""
    name = conn.dialect.name
    if name == "postgresql":
        return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
    if name in ("mysql", "mariadb"):
        return int(conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one())
    return None


async def handle_async(call: ForkedCall, session: AsyncSession) -> Finished:
    await asyncio.sleep(0.05)
    session.add(ForkedEffect(call_id=call.id, pid=os.getpid()))
    return Finished()


def handle_sync(call: ForkedCall, session: Session) -> Finished:
    time.sleep(0.05)
    session.add(ForkedEffect(call_id=call.id, pid=os.getpid()))
    return Finished()


def handle_pool(call: ForkedCall, session: Session) -> Finished:
    """As ``handle_sync``, and it reads through the application's engine too."""
    assert APP_ENGINE is not None
    with APP_ENGINE.connect() as conn:
        app_session = server_session(conn)
    time.sleep(0.05)
    session.add(ForkedEffect(call_id=call.id, pid=os.getpid(), app_session=app_session))
    return Finished()


def catches_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        found += [int(child) for child in text.split()]
    return found


def main(url: str, mode: str) -> None:
    # An application's own handler, as a service installs one before it starts.
    signal.signal(signal.SIGTERM, lambda *_: None)
    global APP_ENGINE
    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    APP_ENGINE = create_engine(url)
    with contextlib.ExitStack() as held:
        held_open = [held.enter_context(APP_ENGINE.connect()) for _ in range(APP_CONNECTIONS)]
        app_sessions = [server_session(conn) for conn in held_open]
    coordinator = Coordinator(sessionmaker(engine), database_url=url, poll_seconds=0.05)
    concurrency = POOL_CONCURRENCY if mode == "pool" else 8
    register = coordinator.transactional_worker(
        "forked", ForkedCall, concurrency=concurrency, executor=mode
    )
    if mode == "asyncio":
        register(handle_async)
    elif mode == "pool":
        register(handle_pool)
    else:
        register(handle_sync)
    coordinator.create_worker_tables()
    coordinator.start()
    try:
        with Session(engine) as session, session.begin():
            session.add_all(ForkedCall(id=n) for n in range(1, CALLS + 1))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with Session(engine) as session:
                statuses = {
                    coordinator.execution_status(session, worker="forked", source_id=n)
                    for n in range(1, CALLS + 1)
                }
            if statuses == {ExecutionStatus.FINISHED}:
                break
            time.sleep(0.05)
        processes = children_of(os.getpid())
        tree: list[dict[str, Any]] = [
            {
                "pid": pid,
                "parent": parent_of(pid),
                "catches_sigterm": catches_sigterm(pid),
                # A forked process has its parent's command line; a new interpreter not.
                "forked": Path(f"/proc/{pid}/cmdline").read_bytes()
                == Path("/proc/self/cmdline").read_bytes(),
            }
            for pid in processes
        ]
        with Session(engine) as session:
            effects = session.execute(
                select(ForkedEffect.call_id, func.count(), func.min(ForkedEffect.pid)).group_by(
                    ForkedEffect.call_id
                )
            ).all()
            used = session.scalars(select(ForkedEffect.app_session).distinct()).all()
        # The service's own connections still work (none was used or closed elsewhere).
        with contextlib.ExitStack() as held:
            held_open = [held.enter_context(APP_ENGINE.connect()) for _ in range(APP_CONNECTIONS)]
            app_sessions_after = [server_session(conn) for conn in held_open]
    finally:
        coordinator.stop()
        Base.metadata.drop_all(engine)
    print(
        json.dumps(
            {
                "coordinator": os.getpid(),
                "effects": {str(call): [count, pid] for call, count, pid in effects},
                "tree": tree,
                "app_sessions": app_sessions,
                "app_sessions_after": app_sessions_after,
                "handler_app_sessions": [s for s in used if s is not None],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
