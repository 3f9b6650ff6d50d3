"""Helpers for the crash tests: waiting, processes seen through /proc, database setup."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from dbworker import Coordinator, ExecutionState, ExecutionStatus
from dbworker.dialects import for_url
from serving import process_in_session
from topologies.pgbouncer import listen_url
from waiting import DEADLINE, wait_until

from . import app

T = TypeVar("T")


# -- processes, through /proc ----------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    session: int


def proc_stat(pid: int) -> ProcStat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name is in parentheses and may contain spaces: split after it.
    fields = text[text.rindex(")") + 2 :].split()
    return ProcStat(pid, fields[0], int(fields[1]), int(fields[3]))


def all_pids() -> set[int]:
    return {int(name) for name in os.listdir("/proc") if name.isdigit()}


def live_children(ppid: int) -> set[int]:
    children = set()
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat is not None and stat.ppid == ppid and stat.state not in ("Z", "X"):
            children.add(pid)
    return children


def live_session_members(session_id: int) -> set[int]:
    members = set()
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat is not None and stat.session == session_id and stat.state not in ("Z", "X"):
            members.add(pid)
    return members


# -- the database ---------------------------------------------------------------------


def open_engine(url: str) -> Engine:
    """The application's engine, as an application would make it: plain defaults."""
    return create_engine(url)


def open_dbworker_engine(url: str) -> Engine:
    """An engine set up as dbworker sets up its own, for calling a dialect directly:
    SQLite takes the write lock at BEGIN (BEGIN IMMEDIATE, WAL, busy timeout), MySQL
    reads committed rows."""
    dialect = for_url(url)
    engine = create_engine(url, **dialect.coordinator_engine_options())
    dialect.configure_engine(engine)
    return engine


def make_coordinator(
    engine: Engine,
    url: str,
    *,
    lease_seconds: float,
    concurrency: int,
    max_poll_seconds: float = 0.2,
    notifications: bool = True,
    executor: str | None = None,
) -> Coordinator:
    """A coordinator of the crash worker, with its tables created, not started."""
    coordinator = Coordinator(
        sessionmaker(engine),
        database_url=url,
        lease_seconds=lease_seconds,
        # Quick polls keep the tests short; they do not change what is tested.
        poll_seconds=0.05,
        max_poll_seconds=max_poll_seconds,
        notifications=notifications,
        # Through PgBouncer, LISTEN goes to the server itself (as documented).
        listen_url=listen_url(url),
    )
    app.register(coordinator, concurrency, executor)
    app.Base.metadata.tables[app.Item.__tablename__].create(engine, checkfirst=True)
    app.Base.metadata.tables[app.Effect.__tablename__].create(engine, checkfirst=True)
    coordinator.create_worker_tables()
    return coordinator


def add_items(
    engine: Engine, workdir: Path, modes: Sequence[str], sleep_seconds: float = 0.0
) -> list[int]:
    """Insert items 1..n with the given modes; return their ids."""
    with Session(engine) as session, session.begin():
        for number, mode in enumerate(modes, start=1):
            session.add(
                app.Item(id=number, mode=mode, workdir=str(workdir), sleep_seconds=sleep_seconds)
            )
    return list(range(1, len(modes) + 1))


def state(coordinator: Coordinator, engine: Engine, item_id: int) -> ExecutionState | None:
    with Session(engine) as session:
        return coordinator.workers[app.WORKER].state(session, item_id)


def status(coordinator: Coordinator, engine: Engine, item_id: int) -> ExecutionStatus | None:
    found = state(coordinator, engine, item_id)
    return None if found is None else found["execution_status"]


def status_of(worker: Any, engine: Engine, item_id: int) -> ExecutionStatus | None:
    """The execution status of ``item_id`` in ``worker`` (a ``coordinator.workers`` entry)."""
    with Session(engine) as session:
        found = worker.state(session, item_id)
    return None if found is None else found["execution_status"]


def kill_mid_group(
    coordinator: Coordinator,
    worker: Any,
    engine: Engine,
    stopped: Path,
    items: int,
    in_flight: Callable[[int, int], None],
    wait: float = 60.0,
) -> tuple[int, int]:
    """Start ``coordinator``; once a handler of ``worker`` (a ``coordinator.workers``
    entry) has stopped in the middle of a group (it
    wrote its item and process id to ``stopped``), check ``in_flight(previous item,
    pid)`` (what must hold of the group before the crash), SIGKILL that process and wait
    until items 1..``items`` are all FINISHED; the coordinator is stopped after. Returns
    (the stopped item, the process killed)."""
    coordinator.start()
    try:
        wait_until(stopped.exists, "an item to stop in the middle of a group", wait)
        item, pid = (int(value) for value in stopped.read_text().split())
        in_flight(item - 1, pid)
        os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: all(
                status_of(worker, engine, i) is ExecutionStatus.FINISHED
                for i in range(1, items + 1)
            ),
            "every item to finish",
            wait,
        )
    finally:
        coordinator.stop(timeout=0)
    return item, pid


def charged_crashes(worker: Any, engine: Engine, item_ids: Iterable[int]) -> dict[int, int]:
    """The items of ``worker`` whose record counts a crash, and how many."""
    with Session(engine) as session:
        return {
            i: found["crashes"]
            for i in item_ids
            if (found := worker.state(session, i)) is not None and found["crashes"]
        }


def unfinished_states(
    coordinator: Coordinator, engine: Engine, item_ids: Sequence[int]
) -> dict[int, ExecutionState | None]:
    """The states of the items that are not FINISHED, for failure messages."""
    found = {i: state(coordinator, engine, i) for i in item_ids}
    return {
        i: s
        for i, s in found.items()
        if s is None or s["execution_status"] is not ExecutionStatus.FINISHED
    }


def effects(engine: Engine, item_id: int | None = None) -> list[tuple[int, int, int]]:
    """Committed effects as (item_id, run, pid), in insertion order."""
    query = select(app.Effect.item_id, app.Effect.run, app.Effect.pid).order_by(app.Effect.id)
    if item_id is not None:
        query = query.where(app.Effect.item_id == item_id)
    with Session(engine) as session:
        return [(i, r, p) for i, r, p in session.execute(query).all()]


def effect_count(engine: Engine) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).select_from(app.Effect)) or 0)


def runs(workdir: Path, item_id: int) -> list[int]:
    """Pids of the announced runs of ``item_id``, in run order."""
    pids = []
    number = 1
    while (path := app.run_path(workdir, item_id, number)).exists():
        pids.append(app.read_pid(path))
        number += 1
    return pids


def wait_for_run(workdir: Path, item_id: int, run: int, timeout: float = DEADLINE) -> int:
    """Wait until run ``run`` of ``item_id`` has started; return its pid."""
    path = app.run_path(workdir, item_id, run)
    wait_until(path.exists, f"run {run} of item {item_id} to start", timeout)
    return app.read_pid(path)


def open_gate(workdir: Path, item_id: int, run: int) -> None:
    app.touch(app.go_path(workdir, item_id, run))


# -- a coordinator in its own process ---------------------------------------------------


@contextlib.contextmanager
def coordinator_process(
    url: str,
    log_path: Path,
    *,
    lease_seconds: float,
    concurrency: int,
    executor: str = "pool",
    heartbeat: float | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``run_coordinator`` in a new session; on exit kill whatever is left of it.

    The new session makes every process it starts (fork server, pool children,
    resource tracker) findable by session id, and lets cleanup kill them as a group.
    """
    module = app.__name__.rpartition(".")[0] + ".run_coordinator"
    command = [
        sys.executable,
        "-m",
        module,
        url,
        "--lease",
        str(lease_seconds),
        "--concurrency",
        str(concurrency),
        "--executor",
        executor,
        *([] if heartbeat is None else ["--heartbeat", str(heartbeat)]),
        *([] if listen_url(url) is None else ["--listen-url", str(listen_url(url))]),
    ]
    try:
        with process_in_session(command, log_path) as process:
            yield process
    finally:
        # Nothing of it may outlive the test and write into the next test's database.
        wait_until(
            lambda: not live_session_members(process.pid),
            "the killed coordinator's processes to exit",
        )
