"""What operators see: the backlog counted against a hand count, and one record in full.

The backlog is every source row that matches ``eligible`` now and is not claimed,
whether or not discovery has recorded it yet.
"""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

from sqlalchemy import Integer, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Coordinator, Finished
from dbworker.backlog import db_now, measure, waiting

from . import app
from .support import Site, wait_until
from .test_cli import (
    COMMAND_TIMEOUT,
    DBWORKER,
    REFERENCE,
    dbworker,
    environment,
    ok,
    reaped,
    worked,
)

#: Record states by job id (discovered ids), and the ids inserted after discovery.
PENDING = [21, 22, 23]
UNFINISHED_DUE = [24, 25, 26]
UNFINISHED_LATER = [27, 28, 29]
WORKING_LIVE = [30, 31, 32]
WORKING_EXPIRED = [33, 34, 35]
FAILED = [36, 37]
FINISHED = [38, 39, 40]
UNDISCOVERED = list(range(41, 51))
DISABLED = [22, 25, 28, 31, 34, 37, 41, 42]


def coordinator_of(s: Site) -> Coordinator:
    coordinator = s.coordinator()
    coordinator.transactional_worker(
        name="jobs",
        source=app.Job,
        eligible=lambda: select(app.Job).where(app.Job.enabled.is_(True)).order_by(app.Job.id),
    )(app.run_job)
    coordinator.create_worker_tables()
    return coordinator


def hand_count(s: Site, coordinator: Coordinator, now: float) -> int:
    """The backlog by the definition, row by row in Python."""
    table = coordinator._registration("jobs").table.table
    with s.session_factory() as session:
        jobs = session.execute(select(app.Job.id, app.Job.enabled)).all()
        records = {r.source_id: r for r in session.execute(select(table)).all()}
    count = 0
    for job_id, enabled in jobs:
        record = records.get(job_id)
        if not enabled:
            continue
        if (
            record is None
            or record.status == "pending"
            or (record.status == "unfinished" and (record.not_before or 0) <= now)
            or (record.status == "working" and record.lease_expires_at < now)
        ):
            count += 1
    return count


def test_backlog_matches_a_hand_count(ops: Site) -> None:
    coordinator = coordinator_of(ops)
    registration = coordinator._registration("jobs")
    dialect = coordinator._dialect
    ops.add_jobs(range(1, 21), app.QUICK)
    assert coordinator.drain().counts()["jobs"] == {"finished": 20}
    ops.add_jobs(range(21, 41), app.QUICK)
    table = registration.table.table
    with ops.engine.begin() as conn:
        dialect.discover(conn, registration.table)
        now = db_now(conn, dialect)

        def put(ids: list[int], **values: Any) -> None:
            conn.execute(update(table).where(table.c.source_id.in_(ids)).values(**values))

        put(UNFINISHED_DUE, status="unfinished", not_before=now - 10)
        put(UNFINISHED_LATER, status="unfinished", not_before=now + 3600)
        put(WORKING_LIVE, status="working", lease_expires_at=now + 3600)
        put(WORKING_EXPIRED, status="working", lease_expires_at=now - 10)
        put(FAILED, status="failed", error="boom")
        put(FINISHED, status="finished", finished_at=now)
    ops.add_jobs(UNDISCOVERED, app.QUICK)
    for job_id in DISABLED:
        ops.set_job(job_id, enabled=False)

    with ops.engine.connect() as conn:
        now = db_now(conn, dialect)
        counted, _ = waiting(conn, dialect, registration, now)
        figures = measure(conn, dialect, registration)
    expected = hand_count(ops, coordinator, now)
    # Spelled out too, so that a wrong hand count cannot agree with a wrong query:
    # pending 21, 23; due 24, 26; expired 33, 35; undiscovered 43-50.
    assert expected == 2 + 2 + 2 + 8
    assert counted == expected
    assert figures["waiting"] == expected
    assert figures["running"] == len(WORKING_LIVE)
    assert figures["finished_last_minute"] == 20 + len(FINISHED)
    assert sum(figures["history"]) == 20 + len(FINISHED)
    # The oldest waiting record's age (job rows have no timestamp column): the due
    # unfinished ones, due 10 s ago.
    assert 9 <= figures["oldest_waiting_seconds"] < 60


class _Unmigrated(DeclarativeBase):
    pass


class NotCreatedYet(_Unmigrated):
    """A source whose table the application has not created (its migration not run)."""

    __tablename__ = "vis_not_created_yet"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)


def _never_runs(source: NotCreatedYet, session: Session) -> Finished:
    raise AssertionError("nothing can be claimed from a table that does not exist")


def test_a_worker_whose_source_table_is_missing_has_no_backlog(ops: Site) -> None:
    coordinator = ops.coordinator()
    coordinator.transactional_worker(name="early", source=NotCreatedYet)(_never_runs)
    coordinator.create_worker_tables()
    with ops.engine.connect() as conn:
        figures = measure(conn, coordinator._dialect, coordinator._registration("early"))
    assert figures["waiting"] is None and figures["running"] == 0


def test_show_prints_one_record_with_its_traceback(ops: Site) -> None:
    worked(ops)
    text = ok(dbworker(ops.url, "show", REFERENCE, "jobs", "3", cwd=ops.workdir))
    fields = dict(line.split(None, 1) for line in text.split("\n\ntraceback:")[0].splitlines())
    assert fields["status"] == "failed" and fields["source_id"] == "3"
    assert fields["attempts"] == "1" and fields["error_type"].endswith("ValueError")
    traceback_text = text.split("\n\ntraceback:\n", 1)[1]
    assert traceback_text.startswith("Traceback (most recent call last):")
    assert "ValueError" in traceback_text.splitlines()[-1]

    as_json = json.loads(
        ok(dbworker(ops.url, "show", REFERENCE, "jobs", "3", "--json", cwd=ops.workdir))
    )
    assert as_json["traceback"].rstrip() == traceback_text.rstrip()
    # With the application in the environment, WORKER ID alone.
    env = {"DBWORKER_APP": REFERENCE}
    alone = ok(dbworker(ops.url, "show", "jobs", "3", cwd=ops.workdir, env=env))
    assert alone == text

    missing = dbworker(ops.url, "show", REFERENCE, "jobs", "99", cwd=ops.workdir)
    assert missing.returncode == 1 and "no record of 99" in missing.stderr
    bad = dbworker(ops.url, "show", REFERENCE, "jobs", "x", cwd=ops.workdir)
    assert bad.returncode == 2


def test_status_watch_refreshes_until_interrupted(ops: Site) -> None:
    worked(ops)
    command = [str(DBWORKER), "status", REFERENCE, "--json", "--watch", "0.1"]
    with reaped(
        subprocess.Popen(
            command,
            env=environment(ops.url),
            cwd=ops.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    ) as process:
        assert process.stdout is not None
        reports = [json.loads(process.stdout.readline()) for _ in range(3)]
        ops.add_jobs([6], app.QUICK)  # a later refresh sees the new row waiting
        wait_until(
            lambda: json.loads(process.stdout.readline())["jobs"]["waiting"] == 1,  # type: ignore[union-attr]
            "a refresh that counts the new row",
        )
        process.send_signal(signal.SIGINT)
        assert process.wait(COMMAND_TIMEOUT) == 0
    assert [r["jobs"]["waiting"] for r in reports] == [0, 0, 0]
