"""Models and handlers of the executor suite, at module scope so children import them.

An item's ``plan`` says what each run of its handler does: runs are separated by
``;`` (the last one repeats for any further run), and a run's actions by ``+``.
Actions in the order they happen:

- ``gate``: wait until the test opens this run's gate (a file);
- ``hang``: sleep far longer than any test (only a kill ends it);
- ``lock``: update its own item row (a row lock, on SQLite the write lock) and
  flush, so that a death after it leaves a transaction holding a lock; then say so
  (``locked_path``);
- ``touch``: change the first item of its directory (by an SQL expression) and leave
  the change for dbworker's flush, when the handler ends;
- ``session``: (PostgreSQL) record what it finds of a previous invocation's session
  state, then leave some behind: a setting, a temporary table, an advisory lock;
- ``exit3``: ``os._exit(3)``; ``sigkill``: SIGKILL its own process;
- then an ``Effect`` row is written and flushed (so a rollback has something to undo;
  after a ``touch``, left for dbworker's flush too);
- ``raise``: raise; ``wrong``: return a wrong type; ``unfinished``: return
  ``Unfinished()``; otherwise return ``Finished()``.

The handler talks to the test through files in a per-test directory stored on the
row: every run announces itself with its pid (so runs are counted even when the
process dies before committing anything), and a gate is a file the test creates.
Files, not rows, so that announcing and waiting take no database locks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from sqlalchemy import Integer, String, Text, func, select, text, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Finished, Outcome, Unfinished
from runfiles import number_run, wait_for_any, write_atomically

WORKER = "job"
DEPENDENT = "after_job"

#: The pid of the test process, set by the suite's conftest: ``unimportable`` imports
#: only in the process whose pid this is.
IMPORTER_PID_ENV = "DBWORKER_TEST_IMPORTER_PID"
#: A variable a test passes to subprocess children; the handler records what it sees.
MARK_ENV = "DBWORKER_TEST_MARK"

#: Longer than any test: a hanging run ends only by being killed.
HANG_SECONDS = 600.0
#: Created by the test at teardown: opens every gate at once.
ALL_GATES = "open-all-gates"


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "exec_items"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    plan: Mapped[str] = mapped_column(String(200))
    workdir: Mapped[str] = mapped_column(String(1000))


class Effect(Base):
    """One row per committed run; no unique constraint, so duplicates would show."""

    __tablename__ = "exec_effects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    worker: Mapped[str] = mapped_column(String(32))
    item_id: Mapped[int] = mapped_column(Integer)
    run: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    #: What the handler's process looked like: JSON of ``process_facts()``.
    info: Mapped[str] = mapped_column(Text)


# -- files shared with the test ------------------------------------------------------


def run_path(workdir: str | Path, worker: str, item_id: int, run: int) -> Path:
    return Path(workdir) / f"run-{worker}-{item_id}-{run}"


def gate_path(workdir: str | Path, item_id: int, run: int) -> Path:
    return Path(workdir) / f"go-{item_id}-{run}"


def locked_path(workdir: str | Path, item_id: int, run: int) -> Path:
    """Written once a ``lock`` action holds its lock."""
    return Path(workdir) / f"locked-{item_id}-{run}"


def announce_run(workdir: str, worker: str, item_id: int) -> int:
    """Record a new run with this process's pid; return its number (1, 2, ...).

    O_EXCL numbers runs atomically even if two processes ran the item at once.
    """
    return number_run(lambda run: run_path(workdir, worker, item_id, run), str(os.getpid()))


def wait_for_gate(workdir: str, item_id: int, run: int) -> None:
    wait_for_any(gate_path(workdir, item_id, run), Path(workdir) / ALL_GATES)


def process_facts() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "mark": os.environ.get(MARK_ENV),
        "cwd": os.getcwd(),
        "prefix": sys.prefix,
        "executable": sys.executable,
    }


ADVISORY_LOCKS_HELD = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
)


def leave_session_state(session: Session) -> dict[str, object]:
    """What this PostgreSQL session holds of an earlier invocation's; then leave the same
    behind for the next one to find (it must not)."""
    found = {
        "backend": session.scalar(text("SELECT pg_backend_pid()")),
        "setting": session.scalar(text("SELECT current_setting('dbworker_test.left', true)")),
        "temp_table": session.scalar(text("SELECT to_regclass('pg_temp.dbworker_left')"))
        is not None,
        "advisory_lock": session.scalar(text(ADVISORY_LOCKS_HELD)),
    }
    session.execute(text("SELECT set_config('dbworker_test.left', 'yes', false)"))
    session.execute(text("CREATE TEMPORARY TABLE IF NOT EXISTS dbworker_left (x int)"))
    session.execute(text("SELECT pg_advisory_lock(4242)"))
    return found


def plan_for_run(plan: str, run: int) -> list[str]:
    runs = plan.split(";")
    return runs[min(run, len(runs)) - 1].split("+")


# -- handlers ------------------------------------------------------------------------


def handle(source: Item, session: Session) -> Outcome:
    return _run(WORKER, source, session)


def handle_without_rollback(source: Item, session: Session) -> Outcome:
    """Waits for its gate without ending the transaction dbworker began for it (the
    opposite of what ``_run`` does), then finishes without writing."""
    run = announce_run(source.workdir, WORKER, source.id)
    wait_for_gate(source.workdir, source.id, run)
    return Finished()


def handle_dependent(source: Item, session: Session) -> Outcome:
    # The item's plan is for the first worker; the dependent one just finishes.
    return _run(DEPENDENT, source, session, plan="finish")


def _run(worker: str, source: Item, session: Session, plan: str | None = None) -> Outcome:
    item_id, workdir = source.id, source.workdir
    plan = source.plan if plan is None else plan
    # End the read transaction before any waiting: on SQLite it holds the
    # database-wide write lock, which would stall the coordinator meanwhile.
    session.rollback()
    run = announce_run(workdir, worker, item_id)
    actions = plan_for_run(plan, run)
    facts: dict[str, object] = {}
    for action in actions:
        if action == "gate":
            wait_for_gate(workdir, item_id, run)
        elif action == "hang":
            time.sleep(HANG_SECONDS)
        elif action == "lock":
            session.execute(update(Item).where(Item.id == item_id).values(plan=plan))
            session.flush()
            write_atomically(locked_path(workdir, item_id, run))
        elif action == "touch":
            first_id = session.scalar(select(func.min(Item.id)).where(Item.workdir == workdir))
            first = session.get(Item, first_id)
            assert first is not None
            # An SQL expression, evaluated by the UPDATE: no lost update.
            first.plan = Item.plan + "+touched"
        elif action == "session":
            facts["session"] = leave_session_state(session)
        elif action == "exit3":
            os._exit(3)
        elif action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
    session.add(
        Effect(
            worker=worker,
            item_id=item_id,
            run=run,
            pid=os.getpid(),
            info=json.dumps({**process_facts(), **facts}),
        )
    )
    # Flushed, so the INSERT really is in the transaction that must roll back (but a
    # touch is left for dbworker's own flush, when the handler ends).
    if "touch" not in actions:
        session.flush()
    if "raise" in actions:
        raise RuntimeError(f"item {item_id} raised on purpose")
    if "wrong" in actions:
        return 42  # type: ignore[return-value]  # the contract violation under test
    if "unfinished" in actions:
        return Unfinished()
    return Finished()
