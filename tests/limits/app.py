"""The application of the limits acceptance tests (issue 26): jobs with a key, one
worker exclusive by key and one rate limited, and a handler that records each run.

At module scope: pool children import the handler by reference.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

from sqlalchemy import Double, Integer, Select, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dbworker import Coordinator, Finished

EXCLUSIVE = "limits_exclusive"
RATED = "limits_rated"


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "limits_jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    key: Mapped[str] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(16))  # which worker's: "exclusive" or "rated"
    sleep_seconds: Mapped[float] = mapped_column(Double, default=0.0)
    #: A job that sleeps ``hang_seconds`` on its first run (its holder is killed then),
    #: announcing that run by creating this file.
    hang_file: Mapped[str | None] = mapped_column(String(1000))


class Run(Base):
    """One committed run: when it started and ended (this host's clock: both services
    run here), and which process ran it."""

    __tablename__ = "limits_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(32))
    # Double: MySQL's FLOAT is single precision, 128 s steps at today's epoch.
    started: Mapped[float] = mapped_column(Double)
    ended: Mapped[float] = mapped_column(Double)
    pid: Mapped[int] = mapped_column(Integer)


def run(job: Job, session: Session) -> Finished:
    started = time.time()
    if job.hang_file is not None and not Path(job.hang_file).exists():
        Path(job.hang_file).write_text(str(os.getpid()))
        time.sleep(600)  # until its coordinator is killed
    time.sleep(job.sleep_seconds)
    session.add(
        Run(job_id=job.id, key=job.key, started=started, ended=time.time(), pid=os.getpid())
    )
    return Finished()


def register(coordinator: Coordinator, concurrency: int) -> None:
    coordinator.transactional_worker(
        EXCLUSIVE,
        Job,
        functools.partial(select_kind, "exclusive"),
        concurrency,
        exclusive_by=Job.key,
    )(run)
    coordinator.transactional_worker(
        RATED, Job, functools.partial(select_kind, "rated"), concurrency, rate_limit="5/s"
    )(run)


def select_kind(kind: str) -> Select[Job]:
    return select(Job).where(Job.kind == kind).order_by(Job.id)
