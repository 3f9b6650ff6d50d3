"""The ``dbworker`` command, run as a subprocess against every database.

The command loads ``operations.cli_app:coordinator``, which reads the database URL
from the environment. Work for status/failed/retry is produced in the test process
by ``drain()`` on a twin coordinator (same workers, same handler), so those tests
need no handler processes; the ``run`` tests start the real thing.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import inspect, select
from sqlalchemy.engine import make_url

from dbworker import Coordinator, ExecutionStatus
from dbworker.logs import ITEM_ATTRIBUTES
from waiting import pid_alive

from . import app
from .support import Site, wait_until

CLI_APP = app.__name__.rpartition(".")[0] + ".cli_app"
REFERENCE = f"{CLI_APP}:coordinator"
URL_ENV = "DBWORKER_OPS_URL"
DBWORKER = Path(sys.executable).with_name("dbworker")
#: Generous: only bounds how long a hung command takes to fail the test.
COMMAND_TIMEOUT = 120.0


def environment(url: str, **extra: str) -> dict[str, str]:
    # The command must import the test package (and handler processes the handler).
    path = os.pathsep.join(p for p in sys.path if p)
    environ = {k: v for k, v in os.environ.items() if k != "DBWORKER_APP"}
    return {**environ, URL_ENV: url, "PYTHONPATH": path, **extra}


def dbworker(
    url: str, *args: str, cwd: Path, module: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``dbworker ARGS`` (or ``python -m dbworker ARGS``) to completion."""
    assert DBWORKER.exists(), f"the dbworker entry point is not installed at {DBWORKER}"
    program = [sys.executable, "-m", "dbworker"] if module else [str(DBWORKER)]
    return subprocess.run(
        [*program, *args],
        env=environment(url, **(env or {})),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )


@contextmanager
def reaped(process: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """``process``, killed at exit if a failed test left it running."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


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
    # Inserted after the last discovery: no record yet, and still work waiting.
    ops.add_jobs([6], app.QUICK)
    # Nothing else is waiting: 5 is unfinished but not due for an hour, quick's
    # pending 3-5 are not eligible. The jobs have no timestamp column, and 6 has no
    # record, so no age is known; drain() finished 1-2 a moment ago.
    backlog = {"waiting": 1, "oldest_waiting_seconds": None, "running": 0}
    expected = {
        "jobs": {"pending": 0, "working": 0, "unfinished": 1, "finished": 2, "failed": 2},
        "quick": {"pending": 3, "working": 0, "unfinished": 0, "finished": 2, "failed": 0},
    }
    measured = {"finished_last_minute": 2, "age_seconds": 0.0, "source": "live"}
    full = {name: {**counts, **backlog, **measured} for name, counts in expected.items()}
    as_json = json.loads(ok(dbworker(ops.url, "status", REFERENCE, "--json", cwd=ops.workdir)))
    assert as_json == full

    human = ok(dbworker(ops.url, "status", REFERENCE, cwd=ops.workdir))
    header = human.splitlines()[0].split()
    assert header == [
        "worker",
        "pending",
        "working",
        "unfinished",
        "finished",
        "failed",
        "waiting",
        "oldest",
        "running",
        "last_min",
    ]
    assert human.strip().splitlines()[-1] == "counted now; waiting: eligible now and not claimed"
    rows = {
        row[0]: dict(zip(header[1:], row[1:], strict=True))
        for row in table_rows("\n".join(human.strip().splitlines()[:-1]))
    }
    assert rows == {
        name: {
            **{status: str(n) for status, n in counts.items()},
            "waiting": "1",
            "oldest": "-",
            "running": "0",
            "last_min": "2",
        }
        for name, counts in expected.items()
    }

    only = json.loads(
        ok(dbworker(ops.url, "status", REFERENCE, "--worker", "quick", "--json", cwd=ops.workdir))
    )
    assert only == {"quick": full["quick"]}


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


# -- cancel -------------------------------------------------------------------------------------


def test_cancel_an_open_item_and_not_a_finished_one(ops: Site) -> None:
    coordinator = worked(ops)
    human = ok(dbworker(ops.url, "cancel", REFERENCE, "jobs", "5", cwd=ops.workdir))
    assert human.strip() == "cancelled item 5 of jobs"
    state = ops.state(coordinator, "jobs", 5)
    assert state is not None
    assert (state["execution_status"], state["error_type"]) == (
        ExecutionStatus.FAILED,
        "dbworker.Cancelled",
    )
    again = json.loads(
        ok(dbworker(ops.url, "cancel", REFERENCE, "jobs", "1", "--json", cwd=ops.workdir))
    )
    assert again == {"worker": "jobs", "source_id": 1, "cancelled": False}
    assert ops.statuses(coordinator, "jobs", [1]) == {1: ExecutionStatus.FINISHED}
    # Retried, the cancelled item runs again.
    assert ok(dbworker(ops.url, "retry", REFERENCE, "jobs", "5", cwd=ops.workdir))
    assert ops.statuses(coordinator, "jobs", [5]) == {5: ExecutionStatus.UNFINISHED}


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
def running(s: Site, log: Path, *options: str) -> Iterator[subprocess.Popen[bytes]]:
    """``dbworker run --create-tables`` in its own session; killed at exit if still alive."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(DBWORKER), "run", REFERENCE, "--create-tables", *options],
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


def test_run_registers_logs_a_banner_and_unregisters(ops: Site, tmp_path: Path) -> None:
    twin(ops)
    log = tmp_path / "run.log"
    with running(ops, log) as process:
        wait_for_log(log, "coordinator started")
        listed = json.loads(
            ok(dbworker(ops.url, "coordinators", REFERENCE, "--json", cwd=ops.workdir))
        )
        assert [(c["pid"], c["stale"]) for c in listed] == [(process.pid, False)]
        assert listed[0]["workers"] == [
            {"name": "jobs", "concurrency": 2, "executor": "Pool"},
            {"name": "quick", "concurrency": 1, "executor": "Pool"},
        ]
        assert listed[0]["version"] == importlib.metadata.version("dbworker")
        human = ok(dbworker(ops.url, "coordinators", REFERENCE, cwd=ops.workdir))
        [row] = table_rows(human)
        assert row[2] == str(process.pid) and row[-1] == "live"
        process.send_signal(signal.SIGTERM)
        assert wait_for_exit(process, log) == 0

    text = log.read_text()
    [banner] = [line for line in text.splitlines() if "coordinator started" in line]
    url = make_url(ops.url)
    assert f"pid {process.pid}" in banner
    assert url.render_as_string(hide_password=True) in banner
    if url.password:
        assert str(url.password) not in text and "***" in banner
    assert "workers jobs (concurrency 2, Pool), quick (concurrency 1, Pool)" in banner
    assert "coordinator stopped" in text.splitlines()[-1]
    # A clean stop leaves no row behind.
    assert (
        json.loads(ok(dbworker(ops.url, "coordinators", REFERENCE, "--json", cwd=ops.workdir)))
        == []
    )


def test_run_serves_metrics(ops: Site, tmp_path: Path) -> None:
    reader = twin(ops)
    ops.add_jobs([1, 2], app.QUICK)
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "run.log"

    def finished() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            text = response.read().decode()
        return {
            sample.labels["worker"]: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "dbworker_items_finished_total"
        }

    with running(ops, log, "--metrics-port", str(port)) as process:
        wait_for_log(log, f"metrics at http://127.0.0.1:{port}/metrics")
        ops.wait_for_status(reader, "jobs", [1, 2], ExecutionStatus.FINISHED)
        ops.wait_for_status(reader, "quick", [1, 2], ExecutionStatus.FINISHED)
        # The handler process commits FINISHED; the coordinator counts the item when it
        # reads the result, a moment later.
        wait_until(
            lambda: finished() == {"jobs": 2.0, "quick": 2.0},
            "the metrics to count each finished item once",
            diagnose=finished,
        )
        process.send_signal(signal.SIGTERM)
        assert wait_for_exit(process, log) == 0


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


def test_run_logs_json_lines_with_the_item_attributes(ops: Site, tmp_path: Path) -> None:
    reader = twin(ops)
    ops.add_jobs([1], app.QUICK)
    log = tmp_path / "run.log"
    with running(ops, log, "--json") as process:
        wait_until(lambda: "dbworker_quick" in inspect(ops.engine).get_table_names(), "tables")
        ops.wait_for_status(reader, "jobs", [1], ExecutionStatus.FINISHED)
        ops.wait_for_status(reader, "quick", [1], ExecutionStatus.FINISHED)
        process.send_signal(signal.SIGTERM)
        assert wait_for_exit(process, log) == 0
    lines = [line for line in log.read_text().splitlines() if line]
    records = [json.loads(line) for line in lines]  # every line: the run's output is JSON
    for record in records:
        assert set(record) >= {"time", "level", "logger", "message", *ITEM_ATTRIBUTES}, record
        moment = dt.datetime.fromisoformat(record["time"])
        assert moment.tzinfo is not None and "T" in record["time"], record
    finished = [r for r in records if r["message"].startswith("item finished in ")]
    assert {(r["worker"], r["source_id"], r["attempt"]) for r in finished} == {
        ("jobs", 1, 1),
        ("quick", 1, 1),
    }
    assert any(r["message"].startswith("SIGTERM: stopping") for r in records), records


# -- options, references and exit statuses ------------------------------------------------------


@pytest.mark.backends("sqlite")
def test_json_before_or_after_the_command(ops: Site) -> None:
    worked(ops)
    before = json.loads(ok(dbworker(ops.url, "--json", "status", REFERENCE, cwd=ops.workdir)))
    after = json.loads(ok(dbworker(ops.url, "status", REFERENCE, "--json", cwd=ops.workdir)))
    assert before == after
    assert before["jobs"]["failed"] == 2


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("where", ["before", "after"])
def test_an_unknown_log_level_is_a_usage_error(ops: Site, where: str) -> None:
    option = ["--log-level", "LOUD"]
    args = [*option, "status", REFERENCE] if where == "before" else ["status", REFERENCE, *option]
    result = dbworker(ops.url, *args, cwd=ops.workdir)
    assert result.returncode == 2
    assert "argument --log-level: invalid choice: 'LOUD'" in result.stderr
    assert "DEBUG" in result.stderr and "CRITICAL" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.backends("sqlite")
def test_debug_shows_dbworkers_records_not_every_librarys(ops: Site) -> None:
    worked(ops)
    result = dbworker(ops.url, "status", REFERENCE, "--log-level", "debug", cwd=ops.workdir)
    ok(result)
    assert f"DEBUG dbworker: loaded {REFERENCE}: workers jobs, quick, database sqlite:///" in (
        result.stderr
    )
    # SQLAlchemy logs every statement at DEBUG; those are not dbworker's to show.
    assert "sqlalchemy" not in result.stderr, result.stderr


def test_version() -> None:
    result = subprocess.run(
        [str(DBWORKER), "--version"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    assert result.returncode == 0
    assert result.stdout == f"dbworker {importlib.metadata.version('dbworker')}\n"


@pytest.mark.backends("sqlite")
def test_the_coordinator_from_dbworker_app(ops: Site) -> None:
    worked(ops)
    env = {"DBWORKER_APP": REFERENCE}
    counts = json.loads(ok(dbworker(ops.url, "status", "--json", cwd=ops.workdir, env=env)))
    assert counts["jobs"]["finished"] == 2
    # The command line wins over the environment.
    env = {"DBWORKER_APP": f"{CLI_APP}:missing"}
    ok(dbworker(ops.url, "status", REFERENCE, cwd=ops.workdir, env=env))
    neither = dbworker(ops.url, "status", cwd=ops.workdir)
    assert neither.returncode == 2
    assert "name the application's Coordinator (module:attribute) or set DBWORKER_APP" in (
        neither.stderr
    )


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["run", f"{CLI_APP}:missing"], 2, "has no attribute 'missing'"),
        (["run", "nomodule:coordinator"], 2, "cannot import 'nomodule'"),
        (["status", REFERENCE, "--worker", "nope"], 2, "(registered: jobs, quick)"),
        (["failed", REFERENCE, "--worker", "nope"], 2, "(registered: jobs, quick)"),
        (["retry", REFERENCE, "nope", "1"], 2, "(registered: jobs, quick)"),
        (["retry", REFERENCE, "jobs"], 2, "name the ids to retry, or --all"),
        (["retry", REFERENCE, "jobs", "x"], 2, "'x' is not a valid id for worker 'jobs'"),
        (["cancel", REFERENCE, "nope", "1"], 2, "(registered: jobs, quick)"),
        (["cancel", REFERENCE, "jobs", "x"], 2, "'x' is not a valid id for worker 'jobs'"),
        (["status", REFERENCE], 1, "the worker table(s) dbworker_jobs, dbworker_quick do not"),
    ],
    ids=[
        "run-bad-attribute",
        "run-no-module",
        "status-unknown-worker",
        "failed-unknown-worker",
        "retry-unknown-worker",
        "retry-no-ids",
        "retry-bad-id",
        "cancel-unknown-worker",
        "cancel-bad-id",
        "no-tables",
    ],
)
def test_exit_statuses(ops: Site, args: list[str], status: int, message: str) -> None:
    if args[-1] != REFERENCE:
        twin(ops).create_worker_tables()
    result = dbworker(ops.url, *args, cwd=ops.workdir)
    assert result.returncode == status, result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.backends("sqlite")
def test_status_before_the_tables_exist_says_so(ops: Site) -> None:
    result = dbworker(ops.url, "status", REFERENCE, cwd=ops.workdir)
    assert result.returncode == 1
    assert result.stderr.endswith(
        "do not exist yet in " + ops.url + ": run `dbworker create-tables` (or your "
        "migrations) first\n"
    ), result.stderr
    ok(dbworker(ops.url, "create-tables", REFERENCE, cwd=ops.workdir))
    ok(dbworker(ops.url, "status", REFERENCE, cwd=ops.workdir))


@pytest.mark.backends("sqlite")
def test_failed_json_has_iso_8601_timestamps(ops: Site) -> None:
    worked(ops)
    items = json.loads(ok(dbworker(ops.url, "failed", REFERENCE, "--json", cwd=ops.workdir)))
    assert [item["source_id"] for item in items] == [3, 4]
    for item in items:
        updated = dt.datetime.fromisoformat(item["updated_at"])
        assert "T" in item["updated_at"] and updated.utcoffset() == dt.timedelta(0), item


@pytest.mark.parametrize(
    "args", [[], ["run"], ["create-tables"], ["status"], ["failed"], ["retry"], ["cancel"]]
)
def test_help_is_plain_text(args: list[str]) -> None:
    result = subprocess.run(
        [str(DBWORKER), *args, "--help"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    assert "``" not in result.stdout and ":class:" not in result.stdout, result.stdout
    assert "exit status:" in result.stdout
    assert "DBWORKER_APP" in result.stdout


def test_an_unreachable_database_is_exit_status_1(tmp_path: Path) -> None:
    # Nothing listens on port 1: the command says why it failed, without a traceback.
    url = "postgresql+psycopg://nobody@127.0.0.1:1/app?connect_timeout=5"
    result = dbworker(url, "status", REFERENCE, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("dbworker: OperationalError: "), result.stderr
    assert "Traceback" not in result.stderr
