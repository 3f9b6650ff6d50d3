"""The dbworker side of ``benchmarks.io``: the model, the I/O-bound handlers (each waits
``WAIT_SECONDS`` and writes one row) and the coordinator process that runs them.

Run by the benchmark as ``python -m benchmarks.io_work URL MODE CONCURRENCY [wake]``: it
starts a coordinator (``executor=MODE``: "asyncio" runs ``wait_async``, "threads"
``wait_sync``, "uvloop" ``wait_async`` on ``AsyncIO(loop="uvloop")``; "MODE:N" runs
them on N handler processes), prints one JSON line once its handler processes are ready,
and runs until terminated. ``wake``
(PostgreSQL): the calls' table gets dbworker's opt-in NOTIFY trigger
(``create_notify_triggers``), as for rows another service inserts, which the benchmark's
inserts are: the coordinator is woken by their commit instead of finding them by polling
(every 20 ms, backing off to 50 ms while idle).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any

from sqlalchemy import Integer, create_engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import AsyncIO, Coordinator, Finished, Outcome, Threads

from .io_trace import mark

WORKER = "io_bench"
WAIT_SECONDS = 0.3


class Base(DeclarativeBase):
    pass


class Call(Base):
    __tablename__ = "io_bench_calls"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)


class Done(Base):
    """One row per committed call; no unique constraint, so duplicates would show."""

    __tablename__ = "io_bench_done"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    call_id: Mapped[int] = mapped_column(Integer)


async def wait_async(call: Call, session: AsyncSession) -> Outcome:
    mark("start", call.id)
    await asyncio.sleep(WAIT_SECONDS)
    mark("ret", call.id)
    session.add(Done(call_id=call.id))
    return Finished()


def wait_sync(call: Call, session: Session) -> Outcome:
    call_id = call.id
    session.rollback()  # no transaction (on SQLite: no write lock) while it waits
    mark("start", call_id)
    time.sleep(WAIT_SECONDS)
    mark("ret", call_id)
    session.add(Done(call_id=call_id))
    return Finished()


def serve(url: str, mode: str, concurrency: int, wake: bool = False) -> None:
    engine = create_engine(url)
    coordinator = Coordinator(
        sessionmaker(engine), database_url=url, poll_seconds=0.02, max_poll_seconds=0.05
    )
    kind, _, processes = mode.partition(":")
    count = int(processes or 1)
    executor: Any = kind
    if kind == "uvloop":
        executor = AsyncIO(processes=count, loop="uvloop")
    elif processes:
        executor = AsyncIO(processes=count) if kind == "asyncio" else Threads(processes=count)
    register = coordinator.transactional_worker(
        name=WORKER, source=Call, concurrency=concurrency, executor=executor
    )
    if kind in ("asyncio", "uvloop"):
        register(wait_async)
    else:
        register(wait_sync)
    coordinator.create_worker_tables()
    if wake:
        coordinator.create_notify_triggers()
    coordinator.start()
    stopped = False

    def stop(*_: Any) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    print(json.dumps({"ready": True}), flush=True)
    while not stopped:
        time.sleep(0.05)
    coordinator.stop(timeout=5)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["wake"])
