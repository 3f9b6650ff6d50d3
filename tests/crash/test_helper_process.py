"""The fork server (the helper that starts handler processes) killed while a coordinator
starts: the start tries again on a new fork server, or the service exits non-zero with
one line a supervisor can act on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dbworker.executors import children

#: The application the service runs: a SQLite worker whose fork server is killed, with
#: its request pending, every time a process is started (what a supervisor must hear of).
#: Its pool starts from the fork server from the first process on (by default a
#: single-threaded service forks its pool's first processes itself, ``interpreter.py``,
#: and the fork server starts processes only to replace them).
APP = """
import multiprocessing.forkserver as forkserver
import os
import signal

from sqlalchemy import Integer, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from dbworker import Coordinator, Finished, Pool


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "job"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)


URL = "sqlite:///" + os.path.join(os.path.dirname(os.path.abspath(__file__)), "app.sqlite")
engine = create_engine(URL)
Base.metadata.create_all(engine)
coordinator = Coordinator(sessionmaker(engine), database_url=URL)


@coordinator.transactional_worker("job", Job, executor=Pool(start_method="forkserver"))
def job(row: Job, session) -> Finished:
    return Finished()


def killing_connect(fds, _server=forkserver._forkserver):
    # The fork server dies with a start request pending: its answer never comes.
    _server.ensure_running()
    os.kill(_server._forkserver_pid, signal.SIGKILL)
    raise EOFError("unexpected EOF")


forkserver.connect_to_new_process = killing_connect
"""


def test_a_fork_server_killed_during_a_start_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing
    import multiprocessing.forkserver as forkserver

    server: Any = getattr(forkserver, "_forkserver")  # noqa: B009
    original = server.connect_to_new_process
    killed: list[int] = []

    def killing_once(fds: list[int]) -> Any:
        if not killed:
            server.ensure_running()
            killed.append(server._forkserver_pid)
            os.kill(server._forkserver_pid, signal.SIGKILL)
            raise EOFError("unexpected EOF")
        return original(fds)

    # popen_forkserver calls the module-level alias of the bound method.
    monkeypatch.setattr(forkserver, "connect_to_new_process", killing_once)
    context = multiprocessing.get_context("forkserver")
    process, conn = children.start_process(context, _answer, "dbworker-test")
    try:
        assert conn.recv() == "ready"
    finally:
        process.join(5)
        conn.close()
    assert killed and server._forkserver_pid not in (None, killed[0]), "a new fork server"
    assert process.exitcode == 0


def _answer(conn: object) -> None:
    conn.send("ready")  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_service_whose_fork_server_keeps_dying_exits_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "killed_app.py").write_text(textwrap.dedent(APP))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "dbworker", "run", "killed_app:coordinator", "--create-tables"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith("dbworker: cannot start a dbworker-handler process"), lines
    assert "fork server" in lines[-1] or "forkserver" in lines[-1], lines[-1]
