"""The application of the operations tests: models and handlers at module scope.

Handler processes import this module by name, so nothing here depends on test state.
A job row carries everything its handler needs, including ``workdir``: a directory
the handler and the test share. Every invocation announces itself there with a run
file holding the database's clock at the start of the run and the handler's pid.
Files, not rows: a run whose transaction rolls back must still be counted, and
announcing must never wait for a database lock (nor fail while the server is down).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import Boolean, Float, Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Finished, Outcome, Unfinished
from dbworker.dialects import for_engine
from runfiles import number_run, wait_for_any

# What a job's handler does (Job.mode).
QUICK = "quick"  # write an effect, Finished
FAIL = "fail"  # raise on the first fail_times runs, then behave as QUICK
UNFINISHED = "unfinished"  # first run: Unfinished(delay); later runs: QUICK
HUGE = "huge"  # raise an exception whose message is 1 MB
HOLD = "hold"  # write and flush the effect, wait for the gate, Finished (connection held)
RELEASE = "release"  # end the read transaction, wait for the gate, write the effect, Finished
SLEEP = "sleep"  # end the read transaction, sleep `delay` seconds, write the effect, Finished
KILL = "kill"  # SIGKILL its own process

# Which exception a FAIL job raises (Job.error).
ERRORS = ("value", "runtime", "key", "policy")

HUGE_MESSAGE_CHARS = 1_000_000


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "ops_job"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    mode: Mapped[str] = mapped_column(String(16))
    workdir: Mapped[str] = mapped_column(String(1000))
    #: Eligibility switch for tests that hold an item back.
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    fail_times: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str] = mapped_column(String(16), default="runtime")
    delay: Mapped[float] = mapped_column(Float, default=0.0)


class Effect(Base):
    """One row per committed run. No unique constraint on job_id on purpose: a
    duplicate must be stored and counted by the test, not rejected."""

    __tablename__ = "ops_effect"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer)
    run: Mapped[int] = mapped_column(Integer)


APP_TABLES = [Base.metadata.tables[model.__tablename__] for model in (Job, Effect)]


class DocumentBase(DeclarativeBase):
    """A MetaData of its own for the Alembic tests: autogenerate compares all of it."""


class Document(DocumentBase):
    __tablename__ = "ops_document"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    title: Mapped[str] = mapped_column(String(100))


class PolicyError(Exception):
    """An application exception with a module path (for error_type)."""


# -- files shared with the test ----------------------------------------------------------


def run_path(workdir: str | Path, job_id: int, run: int) -> Path:
    return Path(workdir) / f"run-{job_id}-{run}"


def gate_path(workdir: str | Path, job_id: int) -> Path:
    return Path(workdir) / f"go-{job_id}"


def announce_run(workdir: str, job_id: int, db_time: float) -> int:
    """Record a run of ``job_id``; return its number (1, 2, ...).

    O_EXCL numbers runs atomically even if two processes run the job at once.
    """
    return number_run(lambda run: run_path(workdir, job_id, run), f"{db_time!r} {os.getpid()}")


def wait_for_gate(workdir: str, job_id: int) -> None:
    wait_for_any(gate_path(workdir, job_id))


def db_clock(session: Session) -> float:
    """The database's clock, as dbworker reads it for leases and not_before."""
    dialect = for_engine(session.get_bind().engine)
    return float(session.execute(select(dialect.db_now())).scalar_one())


# -- the handler -------------------------------------------------------------------------


def run_job(source: Job, session: Session) -> Outcome:
    job_id, mode, workdir = source.id, source.mode, source.workdir
    fail_times, error, delay = source.fail_times, source.error, source.delay
    run = announce_run(workdir, job_id, db_clock(session))
    if mode == KILL:
        os.kill(os.getpid(), 9)
    if mode == FAIL and run <= fail_times:
        message = f"job {job_id} run {run} failed on purpose"
        if error == "value":
            raise ValueError(message)
        if error == "key":
            raise KeyError(message)
        if error == "policy":
            raise PolicyError(message)
        raise RuntimeError(message)
    if mode == HUGE:
        raise RuntimeError("x" * HUGE_MESSAGE_CHARS)
    if mode == UNFINISHED and run == 1:
        return Unfinished(delay=delay)
    if mode == HOLD:
        session.add(Effect(job_id=job_id, run=run))
        session.flush()
        wait_for_gate(workdir, job_id)
        return Finished()
    if mode in (RELEASE, SLEEP):
        # End the read transaction before waiting, as the README advises for long work
        # (on SQLite it would otherwise hold the database-wide write lock meanwhile).
        session.rollback()
        if mode == RELEASE:
            wait_for_gate(workdir, job_id)
        else:
            time.sleep(delay)
    session.add(Effect(job_id=job_id, run=run))
    return Finished()


def process_document(source: Document, session: Session) -> Finished:
    source.title = source.title.upper()
    return Finished()
