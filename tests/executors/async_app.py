"""``async def`` handlers of the executor suite (the asyncio executor runs only those),
and sync ones that take many at once, at module scope so children import them.

They act on the suite's ``app.Item`` rows by the same plans as ``app.handle`` (see its
docstring): ``gate``, ``hang``, ``raise``, ``wrong``, ``unfinished``, plus ``block``
(``time.sleep``: a handler that blocks the event loop), ``late`` (wait past any
test's timeout without being cancellable, then write its effect: it must not commit),
``lock`` (lock its item by updating it) and ``touch`` (as ``app.handle``'s).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from dbworker import Finished, Outcome, Unfinished
from runfiles import write_atomically

from . import app

#: How long a ``late`` run waits before it writes (past the tests' timeouts).
LATE_SECONDS = 3.0
#: How long a ``block`` run blocks its event loop.
BLOCK_SECONDS = 0.4


async def wait_for_gate(workdir: str, item_id: int, run: int) -> None:
    gates = (app.gate_path(workdir, item_id, run), Path(workdir) / app.ALL_GATES)
    while not any(gate.exists() for gate in gates):
        await asyncio.sleep(0.02)


async def handle(source: app.Item, session: AsyncSession) -> Outcome:
    item_id, workdir, plan = source.id, source.workdir, source.plan
    run = app.announce_run(workdir, app.WORKER, item_id)
    actions = app.plan_for_run(plan, run)
    for action in actions:
        if action == "gate":
            await wait_for_gate(workdir, item_id, run)
        elif action == "hang":
            await asyncio.sleep(app.HANG_SECONDS)
        elif action == "block":
            time.sleep(BLOCK_SECONDS)
        elif action == "late":
            # A handler that swallows its cancel and goes on to write and finish.
            try:
                await asyncio.sleep(LATE_SECONDS)
            except asyncio.CancelledError:
                await asyncio.sleep(LATE_SECONDS)
        elif action == "sleep":
            await asyncio.sleep(0.3)
        elif action == "exit3":
            os._exit(3)
        elif action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "lock":
            await session.execute(
                update(app.Item).where(app.Item.id == item_id).values(plan=app.Item.plan)
            )
            write_atomically(app.locked_path(workdir, item_id, run))
        elif action == "touch":
            first_id = await session.scalar(
                select(func.min(app.Item.id)).where(app.Item.workdir == workdir)
            )
            first = await session.get(app.Item, first_id)
            assert first is not None
            # An SQL expression, evaluated by the UPDATE: no lost update.
            first.plan = app.Item.plan + "+touched"
    session.add(
        app.Effect(
            worker=app.WORKER,
            item_id=item_id,
            run=run,
            pid=os.getpid(),
            info=json.dumps(
                {**app.process_facts(), "loop": type(asyncio.get_running_loop()).__module__}
            ),
        )
    )
    if "touch" not in actions:
        await session.flush()
    if "raise" in actions:
        raise RuntimeError(f"item {item_id} raised on purpose")
    if "wrong" in actions:
        return 42  # type: ignore[return-value]  # the contract violation under test
    if "commit" in actions:
        await session.commit()
    if "unfinished" in actions:
        return Unfinished()
    return Finished()


def handle_sync(source: app.Item, session: Session) -> Outcome:
    """``app.handle``, plus ``late``: wait past the timeout (a thread cannot be stopped),
    then write its effect, which must not commit."""
    if source.plan == "late":
        item_id, workdir = source.id, source.workdir
        session.rollback()  # no transaction (on SQLite: no write lock) while it waits
        run = app.announce_run(workdir, app.WORKER, item_id)
        time.sleep(LATE_SECONDS)
        session.add(app.Effect(worker=app.WORKER, item_id=item_id, run=run, pid=0, info="{}"))
        return Finished()
    return app.handle(source, session)


async def not_a_handler(source: app.Item, session: AsyncSession):  # type: ignore[no-untyped-def]
    yield Finished()
