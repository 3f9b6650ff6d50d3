"""Models, the handler and the worker registration shared by the crash tests.

Everything here lives at module scope because pool children import the handler by
reference. The handler talks to the test through files in a per-test directory (its
path is stored on each item row, so children and coordinator subprocesses find it
without sharing memory or environment with the test): it announces every run with
its pid, and a "gate" item blocks until the test lets that run continue. Files, not
rows, so that announcing and waiting never take database locks (on SQLite a write
would need the database-wide lock that a blocked writer elsewhere might hold).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Float, Integer, String, event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import AsyncIO, Coordinator, Finished, Outcome, Unfinished
from runfiles import number_run, wait_for_any, write_atomically

WORKER = "crash"

# Item modes: what the handler does after announcing its run.
QUICK = "quick"  # write an effect, Finished
SLEEP = "sleep"  # sleep sleep_seconds, write an effect, Finished
GATE = "gate"  # wait for the test's go file, write an effect, Finished
WRITE_GATE = "writegate"  # write an effect (flushed), then wait for the go file, Finished
UNFINISHED = "unfinished"  # write an effect, Unfinished
RAISE = "raise"  # write an effect, then raise
SIGKILL_SELF = "sigkill"  # SIGKILL its own process
EXIT_3 = "exit3"  # os._exit(3)


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "crash_items"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    mode: Mapped[str] = mapped_column(String(16))
    workdir: Mapped[str] = mapped_column(String(1000))
    sleep_seconds: Mapped[float] = mapped_column(Float, default=0.0)


class Effect(Base):
    """One row per committed handler run.

    Deliberately without a unique constraint on item_id: a duplicate effect must be
    stored (and counted by the test), not rejected by the database.
    """

    __tablename__ = "crash_effects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(Integer)
    run: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)


# -- files shared with the test ------------------------------------------------------


def run_path(workdir: str | Path, item_id: int, run: int) -> Path:
    return Path(workdir) / f"run-{item_id}-{run}"


def go_path(workdir: str | Path, item_id: int, run: int) -> Path:
    return Path(workdir) / f"go-{item_id}-{run}"


def marker_path(workdir: str | Path, name: str, item_id: int, run: int) -> Path:
    return Path(workdir) / f"{name}-{item_id}-{run}"


def touch(path: Path) -> None:
    write_atomically(path, str(os.getpid()))


def announce_run(workdir: str, item_id: int) -> int:
    """Record a new run of ``item_id`` with this process's pid; return its number (1, 2...)."""
    return number_run(lambda run: run_path(workdir, item_id, run), str(os.getpid()))


def read_pid(path: Path) -> int:
    return int(path.read_text())


def wait_for_gate(workdir: str, item_id: int, run: int) -> None:
    wait_for_any(go_path(workdir, item_id, run))


# -- the handler -----------------------------------------------------------------------


def handle(source: Item, session: Session) -> Outcome:
    item_id, mode, workdir = source.id, source.mode, source.workdir
    sleep_seconds = source.sleep_seconds
    # End the read transaction before waiting: on SQLite it holds the database-wide
    # write lock (BEGIN IMMEDIATE), which would stall every other process meanwhile.
    session.rollback()
    run = announce_run(workdir, item_id)
    if mode == SIGKILL_SELF:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == EXIT_3:
        os._exit(3)
    if mode == GATE:
        wait_for_gate(workdir, item_id, run)
    if mode == SLEEP:
        time.sleep(sleep_seconds)
    session.add(Effect(item_id=item_id, run=run, pid=os.getpid()))
    # Flush so the INSERT has really reached the database inside the handler's
    # transaction: if the effect is absent later, the rollback removed it.
    session.flush()
    touch(marker_path(workdir, "flushed", item_id, run))
    if mode == WRITE_GATE:
        wait_for_gate(workdir, item_id, run)
        touch(marker_path(workdir, "passed", item_id, run))

    def rolled_back(_session: Any) -> None:
        touch(marker_path(workdir, "rolledback", item_id, run))

    # Fires when dbworker rolls the transaction back (a stale token, or a failure).
    event.listen(session, "after_rollback", rolled_back)
    if mode == RAISE:
        raise RuntimeError(f"item {item_id} raised on purpose")
    if mode == UNFINISHED:
        return Unfinished()
    return Finished()


async def handle_async(source: Item, session: AsyncSession) -> Outcome:
    """``handle`` for the asyncio executor (the modes the concurrent crash tests use)."""
    item_id, mode, workdir = source.id, source.mode, source.workdir
    run = announce_run(workdir, item_id)
    if mode == GATE:
        while not go_path(workdir, item_id, run).exists():
            await asyncio.sleep(0.02)
    session.add(Effect(item_id=item_id, run=run, pid=os.getpid()))
    await session.flush()
    return Finished()


def register(coordinator: Coordinator, concurrency: int, executor: str | None = None) -> None:
    """Register the crash worker; used by the tests and by run_coordinator alike.
    ``executor``: an executor's name, or "uvloop" (``AsyncIO(loop="uvloop")``)."""
    handler: Any = handle_async if executor in ("asyncio", "uvloop") else handle
    choice: Any = AsyncIO(loop="uvloop") if executor == "uvloop" else executor
    coordinator.transactional_worker(
        name=WORKER, source=Item, concurrency=concurrency, executor=choice
    )(handler)
