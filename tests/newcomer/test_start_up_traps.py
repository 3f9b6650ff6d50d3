"""The mistakes of a first deployment, each made for real in a subprocess, each refused at
once with an error that says what to do (instead of a respawn loop, a failure at run
time, or an empty database somewhere else)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from .support import DBWORKER, run_python, write_app

# Every trap here is caught before any database server is involved: SQLite only.


def test_unguarded_start_in_the_main_script_is_refused_once(tmp_path: Path) -> None:
    # The classic: the service script calls start() at its top level. Handler
    # processes import the main script again; each would insert a row and call
    # start() again (the standard library's "bootstrapping phase" error, then a
    # respawn loop, no work done and exit status 0).
    script = write_app(
        tmp_path,
        "service.py",
        """
        with session_factory.begin() as session:
            session.add(Item())
        coordinator.create_worker_tables()
        coordinator.start()
        time.sleep(2)
        coordinator.stop()
        """,
    )
    result = run_python(script, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "ConfigurationError: start() was called from the top level of" in result.stderr
    assert 'if __name__ == "__main__":\n        coordinator.start()' in result.stderr
    assert "bootstrapping phase" not in result.stderr
    # No handler process ever ran the script again: the one row is the parent's.
    with sqlite3.connect(tmp_path / "app.sqlite") as db:
        assert db.execute("SELECT count(*) FROM items").fetchone() == (1,)


def test_guarded_start_in_the_main_script_works(tmp_path: Path) -> None:
    script = write_app(
        tmp_path,
        "service.py",
        """
        def main() -> None:
            with session_factory.begin() as session:
                session.add(Item())
            coordinator.create_worker_tables()
            with coordinator:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    with session_factory() as session:
                        status = coordinator.execution_status(session, worker="work", source_id=1)
                    if status is not None and status.value == "finished":
                        break
                    time.sleep(0.05)
            print("status", status)


        if __name__ == "__main__":
            main()
        """,
    )
    result = run_python(script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "status finished" in result.stdout
    with sqlite3.connect(tmp_path / "app.sqlite") as db:
        assert db.execute("SELECT count(*) FROM items").fetchone() == (1,)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            """
            @coordinator.transactional_worker(name="later", source=Item, executor="pool")
            async def later(item: Item, session: Session) -> Finished:
                return Finished()
            """,
            "the handler later of worker 'later' is an async def function, which the Pool "
            "executor cannot run (it calls handlers with a Session): "
            'use executor="asyncio" (or dbworker.AsyncIO(...)), or define it with def',
            id="async-def-handler-on-a-process-pool",
        ),
        pytest.param(
            """
            from sqlalchemy.ext.asyncio import async_sessionmaker

            Coordinator(async_sessionmaker(), database_url=URL)
            """,
            "session_factory is an async_sessionmaker; dbworker needs a synchronous sessionmaker",
            id="async-sessionmaker",
        ),
        pytest.param(
            """
            Coordinator(sessionmaker(), database_url="postgresql+asyncpg://app@db/app")
            """,
            "database_url uses the asyncio driver 'asyncpg'; dbworker's processes use "
            "synchronous SQLAlchemy: use a synchronous driver (e.g. postgresql+psycopg://...)",
            id="asyncio-driver",
        ),
        pytest.param(
            """
            import sys

            sys.modules["MySQLdb"] = None  # as if mysqlclient were not installed
            Coordinator(sessionmaker(), database_url="mysql+mysqldb://app@db/app")
            """,
            "database_url mysql+mysqldb://app@db/app needs the mysqldb driver (the mysqlclient "
            "package), which is not installed (import of MySQLdb halted; None in "
            "sys.modules): pip install 'dbworker[mysql]'",
            id="missing-driver",
        ),
        pytest.param(
            """
            coordinator.transactional_worker(name="a" * 45, source=Item)
            """,
            f"worker name {'a' * 45!r} is too long: at most 44 characters, so that its "
            "tables fit PostgreSQL's 63-character identifiers",
            id="name-too-long-for-postgresql",
        ),
        pytest.param(
            """
            coordinator.create_worker_tables()
            coordinator.start()
            coordinator.stop()
            coordinator.start()
            """,
            "cannot start after stop(): a Coordinator runs once; build a new one",
            id="start-after-stop",
        ),
    ],
)
def test_trap_is_a_clear_error(tmp_path: Path, body: str, message: str) -> None:
    # Under the guard, so that only the trap itself is being tested.
    indented = "\n".join("    " + line for line in body.strip("\n").splitlines())
    script = write_app(tmp_path, "service.py", f'if __name__ == "__main__":\n{indented}\n')
    result = run_python(script, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    # Compared with whitespace collapsed: the messages are long, the traceback wraps.
    expected = f"dbworker.core.errors.ConfigurationError: {message}"
    assert " ".join(expected.split()) in " ".join(result.stderr.split()), result.stderr


def test_relative_sqlite_path_from_another_directory(tmp_path: Path) -> None:
    # The application says sqlite:///app.sqlite, which means "in the current
    # directory". Run from its own directory, the command finds the database; run
    # from elsewhere it must say where it looked, not create an empty file there.
    project = tmp_path / "project"
    elsewhere = tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    write_app(project, "tasks.py", "", url="sqlite:///app.sqlite", create=False)
    environment = {**os.environ, "PYTHONPATH": str(project)}

    created = run_python(
        DBWORKER, "--log-level", "info", "create-tables", "tasks:coordinator",
        cwd=project, env=environment,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert (
        f"the SQLite path 'app.sqlite' is relative; using {project / 'app.sqlite'} "
        "(resolved in the directory the Coordinator was built in)"
    ) in created.stderr

    here = run_python(DBWORKER, "status", "tasks:coordinator", cwd=project, env=environment)
    assert here.returncode == 0, here.stderr

    there = run_python(DBWORKER, "status", "tasks:coordinator", cwd=elsewhere, env=environment)
    assert there.returncode == 1
    assert (
        f"dbworker: the SQLite database {elsewhere / 'app.sqlite'} does not exist "
        f"(database_url names the relative path 'app.sqlite', resolved against {elsewhere}, "
        "the working directory when the Coordinator was built)"
    ) in there.stderr
    assert not (elsewhere / "app.sqlite").exists()


def test_the_demo_runs_without_warnings(tmp_path: Path) -> None:
    # Handler processes used to import the demo's main module again, by name, while
    # the fork server had already imported it: one RuntimeWarning per process.
    result = run_python(
        "-m", "dbworker.demo", "--items", "4", "--db", str(tmp_path / "demo.sqlite"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert "checks passed" in result.stdout
    # The state not claimed yet has one name everywhere: the CLI's and the demo's.
    header = next(line for line in result.stdout.splitlines() if line.startswith("worker "))
    assert header.split() == ["worker", "pending", "working", "unfinished", "finished", "failed"]
