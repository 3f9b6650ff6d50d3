"""A service whose main thread ends with its coordinator still running (no ``stop()``):
the process exits, its running handler killed and its row released, instead of waiting
for the coordinator's thread for ever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sqlalchemy import create_engine, text

#: The service: one SQLite row whose handler hangs; its main thread starts the
#: coordinator, waits until the handler runs, and returns without stopping anything.
APP = """
import os
import sys
import time

from sqlalchemy import Integer, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from dbworker import Coordinator, Finished

HERE = os.path.dirname(os.path.abspath(__file__))
URL = "sqlite:///" + os.path.join(HERE, "app.sqlite")
STARTED = os.path.join(HERE, "started")


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "job"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)


def hang(row: Job, session) -> Finished:
    session.rollback()  # no write lock held while it hangs
    open(STARTED, "w").close()
    time.sleep(600)
    return Finished()


def main() -> None:
    engine = create_engine(URL)
    Base.metadata.create_all(engine)
    coordinator = Coordinator(sessionmaker(engine), database_url=URL, poll_seconds=0.05)
    coordinator.transactional_worker("job", Job)(hang)
    coordinator.create_worker_tables()
    with Session(engine) as session, session.begin():
        session.add(Job(id=1))
    coordinator.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(STARTED):
        if time.monotonic() > deadline:
            sys.exit("the handler never started")
        time.sleep(0.05)
    print("returning", flush=True)


if __name__ == "__main__":
    main()
"""


def test_a_main_thread_that_ends_stops_its_running_coordinator(tmp_path: Path) -> None:
    (tmp_path / "service.py").write_text(textwrap.dedent(APP))
    done = subprocess.run(
        [sys.executable, str(tmp_path / "service.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=120,  # before the fix: never exits (the coordinator's thread is waited for)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "returning"
    engine = create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")
    try:
        with engine.connect() as conn:
            status = conn.execute(text("SELECT status FROM dbworker_job")).scalar_one()
    finally:
        engine.dispose()
    assert status == "unfinished", "the killed handler's row released, claimable at once"
