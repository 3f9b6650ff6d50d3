"""The ``dbworker`` command, run as a subprocess against every database.

The command loads ``operations.cli_app:coordinator``, which reads the database URL
from the environment. Work for status/failed/retry is produced in the test process
by ``drain()`` on a twin coordinator (same workers, same handler), so those tests
need no handler processes; the ``run`` tests start the real thing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import inspect, select

from dbworker import Coordinator, ExecutionStatus
from waiting import pid_alive

from . import app
from .support import Site, wait_until

CLI_APP = app.__name__.rpartition(".")[0] + ".cli_app"
REFERENCE = f"{CLI_APP}:coordinator"
URL_ENV = "DBWORKER_OPS_URL"
DBWORKER = Path(sys.executable).with_name("dbworker")
#: Generous: only bounds how long a hung command takes to fail the test.
COMMAND_TIMEOUT = 120.0


def environment(url: str) -> dict[str, str]:
    # The command must import the test package (and handler processes the handler).
    path = os.pathsep.join(p for p in sys.path if p)
    return {**os.environ, URL_ENV: url, "PYTHONPATH": path}


def dbworker(
    url: str, *args: str, cwd: Path, module: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``dbworker ARGS`` (or ``python -m dbworker ARGS``) to completion."""
    assert DBWORKER.exists(), f"the dbworker entry point is not installed at {DBWORKER}"
    program = [sys.executable, "-m", "dbworker"] if module else [str(DBWORKER)]
    return subprocess.run(
        [*program, *args],
        env=environment(url),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def twin(s: Site) -> Coordinator:
    """A coordinator registered like cli_app's (same workers, tables and handler)."""
    coordinator = s.coordinator()
    coordinator.transactional_worker(name="jobs", source=app.Job, concurrency=2)(app.run_job)
    coordinator.transactional_worker(
        name="quick",
        source=app.Job,
        eligible=lambda: select(app.Job).where(app.Job.mode == app.QUICK).order_by(app.Job.id),
    )(app.run_job)
    return coordinator


def worked(s: Site) -> Coordinator:
    """Jobs 1-2 finished, 3-4 failed, 5 unfinished (for a long while) under ``jobs``;
    ``quick`` finished 1-2 and has 3-5 discovered but not eligible (pending)."""
    coordinator = twin(s)
    coordinator.create_worker_tables()
    s.add_jobs([1, 2], app.QUICK)
    s.add_jobs([3, 4], app.FAIL, fail_times=99, error="value")
    s.add_jobs([5], app.UNFINISHED, delay=3600.0)
    report = coordinator.drain()
    assert report.counts()["jobs"] == {"finished": 2, "failed": 2, "unfinished": 1}
    return coordinator


def table_rows(output: str) -> list[list[str]]:
    """The rows of a table the command printed (header and rule line dropped)."""
    lines = output.strip().splitlines()
    assert set(lines[1]) <= {"-", " "}, output
    return [line.split() for line in lines[2:]]


# -- create-tables --------------------------------------------------------------------------


def test_create_tables_twice(ops: Site) -> None:
    first = ok(dbworker(ops.url, "create-tables", REFERENCE, cwd=ops.workdir))
    assert first.strip() == "tables ready: dbworker_jobs, dbworker_quick"
    second = json.loads(
        ok(dbworker(ops.url, "create-tables", REFERENCE, "--json", cwd=ops.workdir))
    )
    assert second == {"tables": ["dbworker_jobs", "dbworker_quick"]}
    tables = set(inspect(ops.engine).get_table_names())
    assert {"dbworker_jobs", "dbworker_quick"} <= tables


# -- status -----------------------------------------------------------------------------------


def test_status_counts_items_per_worker_and_status(ops: Site) -> None:
    worked(ops)
    expected = {
        "jobs": {"pending": 0, "working": 0, "unfinished": 1, "finished": 2, "failed": 2},
        "quick": {"pending": 3, "working": 0, "unfinished": 0, "finished": 2, "failed": 0},
    }
    as_json = json.loads(ok(dbworker(ops.url, "status", REFERENCE, "--json", cwd=ops.workdir)))
    assert as_json == expected

    human = ok(dbworker(ops.url, "status", REFERENCE, cwd=ops.workdir))
    header = human.splitlines()[0].split()
    assert header == ["worker", "pending", "working", "unfinished", "finished", "failed"]
    rows = {
        row[0]: dict(zip(header[1:], map(int, row[1:]), strict=True)) for row in table_rows(human)
    }
    assert rows == expected

    only = json.loads(
        ok(dbworker(ops.url, "status", REFERENCE, "--worker", "quick", "--json", cwd=ops.workdir))
    )
    assert only == {"quick": expected["quick"]}


# Refusals happen before any backend-specific work: one backend is enough.
@pytest.mark.backends("sqlite")
def test_status_of_an_unknown_worker(ops: Site) -> None:
    worked(ops)
    result = dbworker(ops.url, "status", REFERENCE, "--worker", "nope", cwd=ops.workdir)
    assert result.returncode != 0
    assert "no worker named 'nope'" in result.stderr
    assert "Traceback" not in result.stderr


# -- failed -----------------------------------------------------------------------------------


def test_failed_lists_failed_items_with_their_error(ops: Site) -> None:
    worked(ops)
    human = ok(dbworker(ops.url, "failed", REFERENCE, cwd=ops.workdir))
    assert human.splitlines()[0].split() == ["worker", "source_id", "attempts", "crashes", "error"]
    rows = table_rows(human)
    assert [row[:4] for row in rows] == [["jobs", "3", "1", "0"], ["jobs", "4", "1", "0"]]
    for row, job_id in zip(rows, (3, 4), strict=True):
        assert " ".join(row[4:]) == f"ValueError: job {job_id} run 1 failed on purpose"

    items = json.loads(ok(dbworker(ops.url, "failed", REFERENCE, "--json", cwd=ops.workdir)))
    assert [(i["worker"], i["source_id"]) for i in items] == [("jobs", 3), ("jobs", 4)]
    assert items[0]["error"] == "ValueError: job 3 run 1 failed on purpose"
    assert items[0]["error_type"] == "ValueError"
    assert (items[0]["attempts"], items[0]["crashes"]) == (1, 0)
    assert items[0]["updated_at"]

    limited = json.loads(
        ok(dbworker(ops.url, "failed", REFERENCE, "--limit", "1", "--json", cwd=ops.workdir))
    )
    assert [i["source_id"] for i in limited] == [3]
    none = json.loads(
        ok(dbworker(ops.url, "failed", REFERENCE, "--worker", "quick", "--json", cwd=ops.workdir))
    )
    assert none == []


# -- retry --------------------------------------------------------------------------------------


def test_retry_resets_named_failed_items(ops: Site) -> None:
    coordinator = worked(ops)
    result = json.loads(
        ok(dbworker(ops.url, "retry", REFERENCE, "jobs", "3", "1", "--json", cwd=ops.workdir))
    )
    # Job 1 finished: it is reported, and left alone.
    assert result == {"reset": [3], "not_failed": [1]}
    statuses = ops.statuses(coordinator, "jobs", [1, 3, 4])
    assert statuses == {
        1: ExecutionStatus.FINISHED,
        3: ExecutionStatus.UNFINISHED,
        4: ExecutionStatus.FAILED,
    }
    state = ops.state(coordinator, "jobs", 3)
    assert state is not None and state["error"] is None

    again = ok(dbworker(ops.url, "retry", REFERENCE, "jobs", "3", cwd=ops.workdir))
    assert again.splitlines() == [
        "reset 0 failed item(s) of jobs",
        "not failed (left alone): 3",
    ]
    # The reset item runs again (and fails again: fail_times is 99).
    report = coordinator.drain(workers=["jobs"])
    assert [(i.source_id, i.outcome) for i in report.items] == [(3, "failed")]


def test_retry_all(ops: Site) -> None:
    coordinator = worked(ops)
    human = ok(dbworker(ops.url, "retry", REFERENCE, "jobs", "--all", cwd=ops.workdir))
    assert human.strip() == "reset 2 failed item(s) of jobs"
    assert ops.statuses(coordinator, "jobs", [3, 4]) == dict.fromkeys(
        [3, 4], ExecutionStatus.UNFINISHED
    )
    nothing = json.loads(
        ok(dbworker(ops.url, "retry", REFERENCE, "jobs", "--all", "--json", cwd=ops.workdir))
    )
    assert nothing == {"reset": [], "not_failed": []}


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope", "3"], "no worker named 'nope'"),
        (["jobs"], "name the ids to retry, or --all"),
        (["jobs", "three"], "'three' is not a valid id for worker 'jobs'"),
    ],
    ids=["unknown-worker", "no-ids", "bad-id"],
)
def test_retry_refuses(ops: Site, args: list[str], message: str) -> None:
    coordinator = worked(ops)
    result = dbworker(ops.url, "retry", REFERENCE, *args, cwd=ops.workdir)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert ops.statuses(coordinator, "jobs", [3, 4]) == dict.fromkeys(
        [3, 4], ExecutionStatus.FAILED
    )


# -- references ---------------------------------------------------------------------------------


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("nomodule:x", "nomodule"),
        (f"{CLI_APP}:missing", "has no attribute 'missing'"),
        (f"{CLI_APP}:not_a_coordinator", "not a dbworker Coordinator"),
        (CLI_APP, "expected module:attribute"),
    ],
    ids=["no-module", "no-attribute", "not-a-coordinator", "no-colon"],
)
def test_bad_coordinator_reference(ops: Site, reference: str, message: str) -> None:
    result = dbworker(ops.url, "status", reference, cwd=ops.workdir)
    assert result.returncode != 0
    assert result.stderr.startswith("dbworker: "), result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.backends("sqlite")
def test_python_dash_m(ops: Site) -> None:
    worked(ops)
    counts = json.loads(
        ok(dbworker(ops.url, "status", REFERENCE, "--json", cwd=ops.workdir, module=True))
    )
    assert counts["jobs"]["failed"] == 2


# -- run ------------------------------------------------------------------------------------------


@contextmanager
def running(s: Site, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``dbworker run --create-tables`` in its own session; killed at exit if still alive."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(DBWORKER), "run", REFERENCE, "--create-tables"],
            env=environment(s.url),
            cwd=s.workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_for_log(log: Path, text: str) -> None:
    wait_until(
        lambda: text in log.read_text(errors="replace"),
        f"{text!r} in the command's output",
        diagnose=lambda: log.read_text(errors="replace")[-3000:],
    )


def wait_for_exit(process: subprocess.Popen[bytes], log: Path) -> int:
    try:
        return process.wait(COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            "dbworker run did not exit:\n" + log.read_text(errors="replace")[-3000:]
        ) from None


def test_run_stops_gracefully_on_sigterm(ops: Site, tmp_path: Path) -> None:
    reader = twin(ops)
    ops.add_jobs([1, 2], app.QUICK)
    ops.add_jobs([3], app.RELEASE)
    log = tmp_path / "run.log"
    with running(ops, log) as process:
        # The tables appear when the command has created them.
        wait_until(lambda: "dbworker_jobs" in inspect(ops.engine).get_table_names(), "tables")
        ops.wait_for_status(reader, "jobs", [1, 2], ExecutionStatus.FINISHED)
        ops.wait_for_runs(3)

        process.send_signal(signal.SIGTERM)
        wait_for_log(log, "SIGTERM: stopping after running handlers finish")
        # Stopping: no new claims, though job 4 is eligible for both workers.
        ops.add_jobs([4], app.QUICK)
        # The running handler is let go only now, after the signal.
        ops.open_gate(3)
        assert wait_for_exit(process, log) == 0

    assert ops.statuses(reader, "jobs", [1, 2, 3, 4]) == {
        1: ExecutionStatus.FINISHED,
        2: ExecutionStatus.FINISHED,
        3: ExecutionStatus.FINISHED,
        4: None,
    }
    assert ops.statuses(reader, "quick", [4]) == {4: None}
    assert ops.effects()[3] == 1
    assert 4 not in ops.effects()


def test_run_second_sigint_stops_at_once(ops: Site, tmp_path: Path) -> None:
    reader = twin(ops)
    ops.add_jobs([1], app.RELEASE)
    log = tmp_path / "run.log"
    with running(ops, log) as process:
        ops.wait_for_runs(1)
        handler_pid = ops.runs(1)[0][1]
        process.send_signal(signal.SIGINT)
        wait_for_log(log, "SIGINT: stopping after running handlers finish")
        process.send_signal(signal.SIGINT)
        # The handler's gate never opens: the command can only exit by killing it.
        assert wait_for_exit(process, log) == 0
    assert not pid_alive(handler_pid)

    state = ops.state(reader, "jobs", 1)
    assert state is not None
    assert state["execution_status"] is ExecutionStatus.UNFINISHED
    # Released, not crashed: claimable at once, and no crash counted against it.
    assert (state["crashes"], state["lease_expires_at"], state["not_before"]) == (0, None, None)
    assert ops.effects() == {}

    # Anyone can claim it now and finish it.
    ops.open_gate(1)
    report = reader.drain(workers=["jobs"])
    assert [(i.source_id, i.outcome) for i in report.items] == [(1, "finished")]
    assert ops.effects() == {1: 1}
