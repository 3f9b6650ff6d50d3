"""The worker of the lone-finish crash test: short handlers that write nothing, whose
FINISHes a handler process records together after a group (SQLite,
``invocation/lone_finishes.py``), and one that stops mid-group for the test to kill.

At module scope, since pool children import the handler by reference. Every run is
announced in a file with its pid (``runfiles``): a run whose FINISH was never
recorded is still counted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import Engine, Integer, String, create_engine, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Coordinator, Finished, Outcome
from runfiles import number_run, write_atomically

from .group_app import STOP_SECONDS, STOPPED, STOPS_MID_GROUP, URL, first_to_stop, run_path

WORKER = "lone_crash"

# The modes (``group_app.prepare_run`` gives them): QUICK announces its run and
# finishes, writing nothing; STOPS_MID_GROUP too, but the first run to find itself
# after the item before it in a group (it ran in this process, and its FINISH is not
# recorded yet) stops there, until killed.


class Base(DeclarativeBase):
    pass


class LoneItem(Base):
    __tablename__ = "lone_crash_items"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    mode: Mapped[str] = mapped_column(String(16))
    workdir: Mapped[str] = mapped_column(String(1000))


def runs(workdir: str | Path, item_id: int) -> list[int]:
    """The pid of each run of ``item_id``, in order."""
    pids, run = [], 1
    while (path := run_path(workdir, item_id, run)).exists():
        pids.append(int(path.read_text()))
        run += 1
    return pids


_outside: dict[str, Engine] = {}


def _status(workdir: str, item_id: int) -> str | None:
    """The execution status of ``item_id`` that others can see."""
    url = (Path(workdir) / URL).read_text()
    engine = _outside.get(url)
    if engine is None:
        engine = _outside[url] = create_engine(url)
    with engine.connect() as conn:
        query = text(f"SELECT status FROM dbworker_{WORKER} WHERE source_id = :id")
        found = conn.execute(query, {"id": item_id}).scalar()
        return None if found is None else str(found)


def _mid_group(source: LoneItem) -> bool:
    previous = source.id - 1
    ran = runs(source.workdir, previous)
    return bool(ran) and ran[-1] == os.getpid() and _status(source.workdir, previous) == "working"


def handle(source: LoneItem, session: Session) -> Outcome:
    item_id, workdir, mode = source.id, source.workdir, source.mode
    number_run(lambda n: run_path(workdir, item_id, n), str(os.getpid()))
    if mode == STOPS_MID_GROUP and _mid_group(source) and first_to_stop(workdir):
        write_atomically(Path(workdir) / STOPPED, f"{item_id} {os.getpid()}")
        time.sleep(STOP_SECONDS)
    return Finished()


def register(coordinator: Coordinator, concurrency: int) -> None:
    coordinator.transactional_worker(name=WORKER, source=LoneItem, concurrency=concurrency)(handle)
