"""A service that starts a Threads or AsyncIO coordinator from a single-threaded process
(``python -m tests.executors.forked_app URL MODE``), as most services do: its handler
process is then forked from the coordinator (``executors/interpreter.py``). Prints one
JSON line: the coordinator's pid, each call's handler pids, and the processes under the
coordinator with their parents and whether each catches SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Integer, create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, ExecutionStatus, Finished

CALLS = 20


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


async def handle_async(call: ForkedCall, session: AsyncSession) -> Finished:
    await asyncio.sleep(0.05)
    session.add(ForkedEffect(call_id=call.id, pid=os.getpid()))
    return Finished()


def handle_sync(call: ForkedCall, session: Session) -> Finished:
    time.sleep(0.05)
    session.add(ForkedEffect(call_id=call.id, pid=os.getpid()))
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
    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    coordinator = Coordinator(sessionmaker(engine), database_url=url, poll_seconds=0.05)
    register = coordinator.transactional_worker("forked", ForkedCall, concurrency=8, executor=mode)
    if mode == "asyncio":
        register(handle_async)
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
    finally:
        coordinator.stop()
        Base.metadata.drop_all(engine)
    print(
        json.dumps(
            {
                "coordinator": os.getpid(),
                "effects": {str(call): [count, pid] for call, count, pid in effects},
                "tree": tree,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
