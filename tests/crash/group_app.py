"""The worker of the group crash test: short handlers that a handler process runs in
groups (``invocation/group.py``), and one that stops mid-group for the test to kill.

At module scope, since pool children import the handler by reference. Like ``app``,
it talks to the test through files in a directory stored on each row: every run is
announced with its pid before it writes, so a run whose transaction never committed
is still counted.

Unlike ``app.handle`` this handler never calls ``session.rollback()``: a handler that
releases its transaction is never grouped.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine, Integer, String, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, Finished, Outcome
from runfiles import number_run, write_atomically
from topologies.pgbouncer import listen_url

WORKER = "group_crash"

QUICK = "quick"  # announce, write an effect, Finished
#: As QUICK, but the first run to find itself in a group after the item before it
#: (which ran in this process and has not committed) stops there, until killed.
STOPS_MID_GROUP = "midgroup"

#: Longer than any test: the stopped run ends only by being killed.
STOP_SECONDS = 600.0
#: The file (in the work directory) naming the item that stopped mid-group, and its pid.
STOPPED = "stopped"
#: The file holding the database's URL, to look from outside the handler's transaction.
URL = "url"


class Base(DeclarativeBase):
    pass


class GroupItem(Base):
    __tablename__ = "group_crash_items"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    mode: Mapped[str] = mapped_column(String(16))
    workdir: Mapped[str] = mapped_column(String(1000))


class GroupEffect(Base):
    """One row per committed handler run; no unique key, so a double is stored."""

    __tablename__ = "group_crash_effects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(Integer)
    run: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)


def run_path(workdir: str | Path, item_id: int, run: int) -> Path:
    return Path(workdir) / f"run-{item_id}-{run}"


def last_run_pid(workdir: str | Path, item_id: int) -> int | None:
    pid, run = None, 1
    while (path := run_path(workdir, item_id, run)).exists():
        pid, run = int(path.read_text()), run + 1
    return pid


_outside: dict[str, Engine] = {}


def _committed_effects(workdir: str, item_id: int) -> int:
    """Effects of ``item_id`` that others can see, read on a connection of its own."""
    url = (Path(workdir) / URL).read_text()
    engine = _outside.get(url)
    if engine is None:
        engine = _outside[url] = create_engine(url)
    with engine.connect() as conn:
        query = select(func.count()).where(GroupEffect.item_id == item_id)
        return int(conn.scalar(query.select_from(GroupEffect)) or 0)


def _mid_group(session: Session, source: GroupItem) -> bool:
    """Whether this run is in a group, after the item before it, uncommitted: that item
    ran last in this process and nobody else can see its effect yet."""
    previous = source.id - 1
    return (
        session.connection().in_nested_transaction()
        and last_run_pid(source.workdir, previous) == os.getpid()
        and _committed_effects(source.workdir, previous) == 0
    )


def first_to_stop(workdir: str) -> bool:
    """Whether this run is the first to ask (the test stops one run only)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(Path(workdir) / (STOPPED + ".lock"), os.O_CREAT | os.O_EXCL))
        return True
    return False


def handle(source: GroupItem, session: Session) -> Outcome:
    item_id, workdir = source.id, source.workdir
    run = number_run(lambda n: run_path(workdir, item_id, n), str(os.getpid()))
    session.add(GroupEffect(item_id=item_id, run=run, pid=os.getpid()))
    session.flush()
    if source.mode == STOPS_MID_GROUP and _mid_group(session, source) and first_to_stop(workdir):
        write_atomically(Path(workdir) / STOPPED, f"{item_id} {os.getpid()}")
        time.sleep(STOP_SECONDS)
    return Finished()


def register(coordinator: Coordinator, concurrency: int) -> None:
    coordinator.transactional_worker(name=WORKER, source=GroupItem, concurrency=concurrency)(handle)


#: Enough short items for the pool to measure them and start grouping, with an item
#: that may stop mid-group every few; leases far longer than the tests: an item run
#: again can only have been handed out again by the coordinator that held it.
ITEMS = 600
EVERY = 5
LONG_LEASE = 120.0


def prepare_run(
    engine: Engine,
    database_url: str,
    workdir: Path,
    register: Callable[[Coordinator, int], None],
    base: type[DeclarativeBase],
    item: Callable[..., object],
) -> Coordinator:
    """A coordinator (not started) of the worker ``register`` adds, over ``ITEMS`` items
    of ``item``'s class, every ``EVERY``-th of which stops mid-group."""
    coordinator = Coordinator(
        sessionmaker(engine),
        database_url=database_url,
        lease_seconds=LONG_LEASE,
        poll_seconds=0.05,
        max_poll_seconds=0.2,
        listen_url=listen_url(database_url),
    )
    register(coordinator, 1)
    base.metadata.create_all(engine)
    coordinator.create_worker_tables()
    (workdir / URL).write_text(database_url)
    with Session(engine) as session, session.begin():
        session.add_all(
            item(id=i, mode=STOPS_MID_GROUP if i % EVERY == 0 else QUICK, workdir=str(workdir))
            for i in range(1, ITEMS + 1)
        )
    return coordinator
